"""kiln audit: a deployment's vectors (or a reranker's scores) against the original's, with the cause of a gap
found by measurement.

Against kiln serve (agrees), against a misconfigured server (CLS pooling, truncated at 32 tokens: the audit must
name both), a misconfigured TEI-shaped reranker (raw logits of (text, query) pairs cut at 32 tokens: all three
named), and every way asking can fail (bad URL, nothing listening, not JSON, wrong shapes, a timeout): one clear
message and a non-zero exit each, never a traceback or a hang. The v2 adapter is tested against a real
tritonserver in test_triton.py.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from kiln.artifact.manifest import MANIFEST_NAME
from kiln.auditing.job import AuditConfig, run_audit
from kiln.auditing.protocols import AuditError, Endpoint
from kiln.serving import process
from kiln.serving.app import ServeConfig, create_app
from kiln.tasks import TaskName

RANKING = TaskName.TEXT_RANKING.value


def audit_cli(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "kiln", "audit", *args], capture_output=True, text=True,
                          timeout=timeout)


def test_kiln_serve_agrees_with_its_original(tiny_model, tiny_artifact, tmp_path):
    with process.serve_in_thread(create_app(ServeConfig(models={"m": tiny_artifact}))) as base:
        for protocol in ("openai", "kiln", "v2"):
            result = run_audit(AuditConfig(Endpoint(base, protocol, "m"), str(tiny_model("bert")), count=24,
                                           output=tmp_path / protocol))
            assert result.within_tolerance and result.min_agreement > 0.9999, result.verdict()
            assert not any(f.differs for f in result.findings), result.findings
    page = (tmp_path / "kiln" / "audit.html").read_text()
    assert "within tolerance" in page and json.loads((tmp_path / "kiln" / "audit.json").read_text())["schema"]


def test_a_misconfigured_server_is_outside_tolerance_with_both_causes_named(tiny_model, tiny_artifact, tmp_path):
    """The same weights served with CLS pooling and a 32-token truncation (a misconfigured kiln deployment)."""
    wrong = tmp_path / "wrong"
    shutil.copytree(tiny_artifact, wrong)
    manifest = json.loads((wrong / MANIFEST_NAME).read_text())
    manifest["task"]["pooling"], manifest["task"]["max_length"] = "cls", 32
    (wrong / MANIFEST_NAME).write_text(json.dumps(manifest))
    with process.serve_in_thread(create_app(ServeConfig(models={"m": wrong}))) as base:
        run = audit_cli(base, str(tiny_model("bert")), "--protocol", "kiln", "--count", "32", "-o",
                        str(tmp_path / "out"))
    assert run.returncode == 4, run.stderr
    findings = {f["cause"]: f for f in json.loads((tmp_path / "out" / "audit.json").read_text())["findings"]}
    assert findings["pooling"]["differs"] and findings["pooling"]["found"].startswith("cls")
    assert findings["truncation"]["differs"] and findings["truncation"]["found"].startswith("32 tokens")
    assert not findings["prefix"]["differs"] and not findings["normalisation"]["differs"]
    assert "explained by pooling, truncation" in run.stderr and "outside tolerance" in run.stderr


def test_kiln_serve_reranks_like_its_original(tiny_model, task_artifacts, tmp_path):
    with process.serve_in_thread(create_app(ServeConfig(models={"r": task_artifacts[TaskName.TEXT_RANKING]}))) as base:
        result = run_audit(AuditConfig(Endpoint(base, "kiln", "r"), str(tiny_model("bert", TaskName.TEXT_RANKING)),
                                       count=32, output=tmp_path, task=RANKING))
        cohere = run_audit(AuditConfig(Endpoint(base, "cohere", "r"), str(tiny_model("bert", TaskName.TEXT_RANKING)),
                                       count=16, output=tmp_path / "cohere", task=RANKING))  # its /v2/rerank
    assert cohere.within_tolerance and cohere.figures["max_score_diff"] < 1e-4, cohere.verdict()
    assert result.within_tolerance and result.min_agreement > 0.9999, result.verdict()
    assert result.figures["max_score_diff"] < 1e-4 and result.figures["top1_agreement"] == 1.0
    assert {f.cause for f in result.findings} == {"activation", "pair order", "truncation", "batch drift"}
    assert not any(f.differs for f in result.findings), result.findings
    assert "mean kendall tau" in (tmp_path / "audit.md").read_text()


def test_kiln_serve_agrees_with_a_causal_embedder_and_reranker(tiny_model, tmp_path):
    """Qwen3-Embedding's last-token pooling (the original pads on the left here, kiln on the right) and
    Qwen3-Reranker's prompt template, rendered by transformers on the original's side, through kiln serve."""
    import json

    import kiln
    from kiln.testing.factory import build_tiny_causal_reranker, write_sentence_transformers_files

    embedder = tmp_path / "embedder"
    shutil.copytree(tiny_model("qwen3"), embedder)
    write_sentence_transformers_files(embedder, pooling="lasttoken")
    tokenizer_config = json.loads((embedder / "tokenizer_config.json").read_text())
    (embedder / "tokenizer_config.json").write_text(json.dumps({**tokenizer_config, "padding_side": "left"}))
    reranker = build_tiny_causal_reranker(tmp_path / "reranker")
    served = {"e": kiln.export(str(embedder), task="feature-extraction", output=tmp_path / "e").artifact.path,
              "r": kiln.export(str(reranker), task=RANKING, output=tmp_path / "r").artifact.path}
    with process.serve_in_thread(create_app(ServeConfig(models=served))) as base:
        vectors = run_audit(AuditConfig(Endpoint(base, "openai", "e"), str(embedder), count=24,
                                        output=tmp_path / "audit-e"))
        scores = run_audit(AuditConfig(Endpoint(base, "kiln", "r"), str(reranker), count=24,
                                       output=tmp_path / "audit-r", task=RANKING))
    assert vectors.within_tolerance and vectors.min_agreement > 0.9999, vectors.verdict()
    assert not any(f.differs for f in vectors.findings), vectors.findings
    assert scores.within_tolerance and scores.figures["max_score_diff"] < 1e-4, scores.verdict()
    assert not any(f.differs for f in scores.findings), scores.findings


def test_kiln_serve_in_tei_mode_agrees_over_teis_api(tiny_model, task_artifacts, tmp_path):
    """The TEI adapter against kiln serve speaking TEI's API (--protocols tei): /embed and /rerank."""
    for task, name in ((TaskName.FEATURE_EXTRACTION, "m"), (TaskName.TEXT_RANKING, "r")):
        app = create_app(ServeConfig(models={name: task_artifacts[task]}, protocols=("tei",)))
        with process.serve_in_thread(app) as base:
            result = run_audit(AuditConfig(Endpoint(base, "tei"), str(tiny_model("bert", task)), count=24,
                                           output=tmp_path / name, task=task.value))
        assert result.min_agreement > 0.9999, result.verdict()
        if task is TaskName.TEXT_RANKING:
            assert result.within_tolerance and not any(f.differs for f in result.findings), result.findings
        else:  # TEI's /embed normalizes by default, this original does not: that alone is the finding
            assert [f.cause for f in result.findings if f.differs] == ["normalisation"], result.findings
            assert not result.within_tolerance and result.explained_by == ("normalisation",)


def _tei_reranker(artifact):
    """A TEI-shaped /rerank that scores (text, query) pairs and answers raw logits: two misconfigurations."""
    from fastapi import FastAPI

    import kiln
    from kiln.tasks import RerankQuery

    predictor = kiln.load(artifact)
    app = FastAPI()

    @app.post("/rerank")
    async def rerank(body: dict):
        swapped = predictor.predict([RerankQuery(t, (body["query"],)) for t in body["texts"]], raw_scores=True)
        return [{"index": i, "score": ranked[0].score} for i, ranked in enumerate(swapped)]

    return app


def test_a_misconfigured_reranker_is_outside_tolerance_with_every_cause_named(tiny_model, task_artifacts, tmp_path):
    wrong = tmp_path / "wrong"
    shutil.copytree(task_artifacts[TaskName.TEXT_RANKING], wrong)
    manifest = json.loads((wrong / MANIFEST_NAME).read_text())
    manifest["task"]["max_length"] = 32
    (wrong / MANIFEST_NAME).write_text(json.dumps(manifest))
    with process.serve_in_thread(_tei_reranker(wrong)) as base:
        run = audit_cli(base, str(tiny_model("bert", TaskName.TEXT_RANKING)), "--task", RANKING, "--protocol", "tei",
                        "--count", "48", "-o", str(tmp_path / "out"))
    assert run.returncode == 4, run.stderr
    findings = {f["cause"]: f for f in json.loads((tmp_path / "out" / "audit.json").read_text())["findings"]}
    assert findings["activation"]["differs"] and findings["activation"]["found"].startswith("raw")
    assert findings["pair order"]["differs"] and findings["pair order"]["found"].startswith("(text, query)")
    assert findings["truncation"]["differs"] and findings["truncation"]["found"].startswith("32 tokens")
    assert not findings["batch drift"]["differs"]
    assert "explained by activation, pair order, truncation" in run.stderr, run.stderr


def test_a_task_audit_cannot_check_is_refused_by_name(tmp_path):
    run = audit_cli("http://127.0.0.1:9", "--task", TaskName.TOKEN_CLASSIFICATION.value, timeout=60)
    assert run.returncode == 2 and "kiln audit checks embedding, reranker and generation deployments" in run.stderr, \
        run.stderr
    run = audit_cli("http://127.0.0.1:9", "--task", TaskName.TEXT_GENERATION.value, "--protocol", "tei", timeout=60)
    assert run.returncode == 2 and "protocol tei: kiln audit asks a decoder's deployment through the " \
        "completions API of: openai" in run.stderr, run.stderr


def test_kiln_serve_generates_the_originals_greedy_text_and_another_model_does_not(tiny_model, tmp_path):
    """A decoder behind kiln serve's OpenAI completions API: its greedy text is the original's token for token; the
    same name serving a model of another seed keeps little of it and is outside tolerance, with the cause that
    differs (none: same tokenizer, greedy) left unnamed."""
    import kiln
    from kiln.testing.factory import build_tiny_model

    original = tiny_model("llama", TaskName.TEXT_GENERATION)
    other = build_tiny_model("llama", TaskName.TEXT_GENERATION, tmp_path / "other", seed=7)
    for name, served, within in (("same", original, True), ("other", other, False)):
        artifact = kiln.export(str(served), task="text-generation", output=tmp_path / f"art-{name}").artifact.path
        with process.serve_in_thread(create_app(ServeConfig(models={"g": artifact}))) as base:
            result = run_audit(AuditConfig(Endpoint(base, "openai", "g"), str(original), count=8,
                                           task=TaskName.TEXT_GENERATION.value, output=tmp_path / f"audit-{name}"))
        assert result.within_tolerance is within, result.verdict()
        assert result.agreement == "greedy agreement" and result.figures["greedy_tokens"] > 0
        assert not any(f.differs for f in result.findings), result.findings
        if within:
            assert result.mean_agreement == 1.0 and result.figures["greedy_identical"] == 1.0, result.verdict()
        else:
            assert result.mean_agreement < result.floor, result.verdict()
    report = json.loads((tmp_path / "audit-same" / "audit.json").read_text())
    assert report["inputs"] == 8 and report["judged"] == "mean"


def test_a_generation_server_that_samples_and_miscounts_prompts_has_both_named(tiny_model, tmp_path):
    """A completions server that answers another text each call and counts one token more per prompt (a BOS the
    original does not add); then one whose answer is not OpenAI's shape: one clear error."""
    from fastapi import FastAPI

    from kiln.auditing.generation import GreedyReference
    from kiln.source.loading import load_source

    original = str(tiny_model("llama", TaskName.TEXT_GENERATION))
    counts = GreedyReference(load_source(original, TaskName.TEXT_GENERATION.value)).token_counts
    app, calls = FastAPI(), []

    @app.post("/v1/completions")
    async def completions(body: dict):
        calls.append(body)
        if body["prompt"] == "shape":
            return {"choices": []}
        return {"choices": [{"text": f" sample {len(calls)}"}],
                "usage": {"prompt_tokens": counts([body["prompt"]])[0] + 1}}

    with process.serve_in_thread(app) as base:
        result = run_audit(AuditConfig(Endpoint(base, "openai", "g"), original, count=8,
                                       task=TaskName.TEXT_GENERATION.value, output=tmp_path / "audit"))
        texts = tmp_path / "prompts.txt"
        texts.write_text("shape\n" * 8)
        with pytest.raises(AuditError, match="not an OpenAI completions answer"):
            run_audit(AuditConfig(Endpoint(base, "openai", "g"), original, texts_file=texts,
                                  task=TaskName.TEXT_GENERATION.value, output=tmp_path / "bad"))
    assert {c["temperature"] for c in calls} == {0} and calls[0]["max_tokens"] == 24
    assert not result.within_tolerance
    assert {f.cause: f.differs for f in result.findings} == {"prompt tokens": True, "determinism": True}
    assert "8 of 8 prompts counted differently by the server (up to +1 tokens" in result.findings[0].found


def _bad_app(mode: str):
    """A server that answers /embed and /v1/embeddings badly, one way per mode."""
    from fastapi import FastAPI
    from fastapi.responses import JSONResponse, PlainTextResponse

    app = FastAPI()

    @app.post("/v1/embeddings")
    async def embeddings(body: dict):
        if mode == "text":
            return PlainTextResponse("this is not json")
        if mode == "slow":
            await asyncio.sleep(5)
        if mode == "error":
            return JSONResponse({"detail": "model exploded"}, status_code=500)
        vectors = [[0.1, 0.2, 0.3]] * len(body["input"])
        if mode == "ragged":
            vectors[-1] = [0.1]
        return {"data": [{"embedding": v, "index": i} for i, v in enumerate(vectors)]}

    return app


@pytest.mark.parametrize(("mode", "message"), [
    ("text", "answered with something that is not JSON"),
    ("ragged", "the answer is not a list of numeric vectors"),
    ("error", "answered HTTP 500"),
    ("slow", "did not answer within 0.5 s (--timeout)"),
    ("shape", "returns 3-dimensional vectors"),
])
def test_every_failure_is_one_clear_error(tiny_model, mode, message, tmp_path):
    """In process (the CLI turns any AuditError into its message and exit 3: see the test below)."""
    with process.serve_in_thread(_bad_app(mode)) as base, pytest.raises(AuditError) as caught:
        run_audit(AuditConfig(Endpoint(base, "openai", timeout_s=0.5), str(tiny_model("bert")), count=8,
                              output=tmp_path))
    assert message in caught.value.message and caught.value.exit_code == 3


def test_bad_urls_and_nothing_listening(tiny_model, tmp_path):
    bad = audit_cli("ftp://example", str(tiny_model("bert")), timeout=60)
    assert bad.returncode == 2 and "URL must be http(s)://host[:port][/prefix]" in bad.stderr
    port = process.free_port()
    gone = audit_cli(f"http://127.0.0.1:{port}", str(tiny_model("bert")), "--count", "8", "-o", str(tmp_path),
                     timeout=60)
    assert gone.returncode == 3 and f"nothing answers at http://127.0.0.1:{port}" in gone.stderr
    with pytest.raises(AuditError, match="nothing answers"):
        from kiln.auditing.protocols import embed

        embed(Endpoint(f"http://127.0.0.1:{port}", "tei"), ["x"])


INFINITY = Path(__file__).resolve().parents[2] / ".venv-infinity" / "bin" / "infinity_emb"


@pytest.fixture(scope="module")
def infinity(minilm_dir, tiny_model, tmp_path_factory):
    """A deployment nobody here wrote: Infinity (infinity-emb 0.0.78, PyTorch engine) serving the bundled MiniLM
    ("minilm") and a tiny cross-encoder ("rr") in one process: (base URL, the cross-encoder's directory)."""
    if not INFINITY.is_file():
        pytest.skip("no Infinity venv (run `make infinity-server`)")
    reranker = tmp_path_factory.mktemp("infinity") / "rr"
    shutil.copytree(tiny_model("bert", TaskName.TEXT_RANKING), reranker)
    # The fixture's tokenizer_config names transformers 5's TokenizersBackend; Infinity's transformers 4 needs the
    # class by its older name (the tokenizer.json both read is the same file).
    config = json.loads((reranker / "tokenizer_config.json").read_text())
    (reranker / "tokenizer_config.json").write_text(json.dumps({**config, "tokenizer_class": "BertTokenizerFast"}))
    proc, port = process.start_server([str(INFINITY), "v2", "--model-id", str(minilm_dir), "--model-id", str(reranker),
                                       "--served-model-name", "minilm", "--served-model-name", "rr", "--engine",
                                       "torch", "--device", "cpu", "--host", "127.0.0.1", "--no-bettertransformer"],
                                      timeout_s=180)  # conftest set HF_HUB_OFFLINE=1, which the child inherits
    yield f"http://127.0.0.1:{port}", reranker
    proc.terminate()
    proc.wait(timeout=60)


def test_infinity_serving_the_bundled_minilm_agrees_with_it(infinity, tmp_path):
    base, _ = infinity
    result = run_audit(AuditConfig(Endpoint(base, "openai", "minilm"), None, count=24, output=tmp_path))
    assert result.within_tolerance and result.min_agreement > 0.9999, result.verdict()
    assert {f.cause: f.differs for f in result.findings} == {"pooling": False, "normalisation": False,
                                                             "truncation": False, "prefix": False,
                                                             "batch drift": False}


def test_infinity_reranking_agrees_with_the_original_cross_encoder(infinity, tmp_path):
    """Infinity's Cohere-style /rerank (the openai protocol's reranker route) against the original's scores."""
    base, reranker = infinity
    result = run_audit(AuditConfig(Endpoint(base, "openai", "rr"), str(reranker), count=48, output=tmp_path,
                                   task=RANKING))
    assert result.within_tolerance and result.min_agreement > 0.9999, result.verdict()
    assert result.figures["max_score_diff"] < 1e-5, result.figures
    assert not any(f.differs for f in result.findings), result.findings
