"""kiln serve in process: routes, batching results equal offline results, errors and backpressure."""

from __future__ import annotations

import base64
import subprocess
import sys
import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
from fastapi.testclient import TestClient

import kiln
from kiln.artifact.directory import Artifact
from kiln.data.texts import builtin_sentences
from kiln.serving.app import ServeConfig, create_app
from kiln.serving.batcher import BatchLimits
from kiln.tasks import TaskName
from kiln.tasks.inputs import RerankQuery, TextPair


@pytest.fixture(scope="module")
def artifacts(task_artifacts):
    return task_artifacts


def client(artifacts, **kwargs) -> TestClient:
    """An in-process server; one engine session unless ``sessions`` is given (tests that wrap
    ``predictor.engine`` see every batch: a server's default is a session per core)."""
    models = kwargs.pop("models", {"embedder": artifacts[TaskName.FEATURE_EXTRACTION]})
    kwargs.setdefault("sessions", 1)
    return TestClient(create_app(ServeConfig(models=models, **kwargs)))


def test_embed_matches_offline_results_whatever_the_batch(artifacts):
    texts = list(builtin_sentences()[:24])
    offline = np.stack(Artifact.open(artifacts[TaskName.FEATURE_EXTRACTION]).predictor().predict(texts))
    with client(artifacts, limits=BatchLimits(max_batch_tokens=2048, max_batch_size=8, max_delay_s=0.02)) as c:
        single = np.array(c.post("/kiln/embed", json={"inputs": texts[0]}).json()["embeddings"][0])
        listed = np.array(c.post("/kiln/embed", json={"inputs": texts}).json()["embeddings"])
        with ThreadPoolExecutor(16) as pool:  # concurrent single requests land in shared batches
            concurrent = list(pool.map(lambda t: c.post("/kiln/embed", json={"inputs": t}).json()["embeddings"][0],
                                       texts))
        metrics = c.get("/metrics").text
    np.testing.assert_allclose(single, offline[0], atol=1e-5)
    np.testing.assert_allclose(listed, offline, atol=1e-5)
    np.testing.assert_allclose(np.array(concurrent), offline, atol=1e-5)
    count = float(next(line.split()[-1] for line in metrics.splitlines() if line.startswith("kiln_batch_size_count")))
    assert count < 1 + 1 + len(texts) + 1  # batches were shared: fewer batches than requests + features
    assert 'kiln_requests_total{route="/kiln/embed",status="200"}' in metrics


def test_openai_compatible_embeddings(artifacts):
    with client(artifacts) as c:
        models = c.get("/v1/models").json()
        assert models["data"][0]["id"] == "embedder"
        out = c.post("/v1/embeddings", json={"input": ["hello world", "kiln"], "model": "embedder"}).json()
        b64 = c.post("/v1/embeddings", json={"input": "hello world", "model": "embedder",
                                            "encoding_format": "base64"}).json()
    assert out["object"] == "list" and [d["index"] for d in out["data"]] == [0, 1]
    assert out["usage"]["prompt_tokens"] > 0
    decoded = np.frombuffer(base64.b64decode(b64["data"][0]["embedding"]), dtype=np.float32)
    np.testing.assert_allclose(decoded, out["data"][0]["embedding"], atol=1e-6)


def test_openai_embeddings_take_token_ids_as_tei_reads_them(artifacts):
    """A text as token ids (OpenAI's and TEI's APIs take them; LangChain's OpenAIEmbeddings sends them by default)
    embeds as the text that tokenizes to them; ids outside the vocabulary are a 422 naming the id."""
    tokenizer = kiln.load(artifacts[TaskName.FEATURE_EXTRACTION]).encoder.tokenizer
    texts = ["hello world", builtin_sentences()[4]]
    ids = [tokenizer.encode(t).ids for t in texts]  # special tokens included, as the model reads them
    with client(artifacts) as c:
        as_text = c.post("/v1/embeddings", json={"input": texts, "model": "embedder"}).json()
        one = c.post("/v1/embeddings", json={"input": ids[0], "model": "embedder"})
        many = c.post("/v1/embeddings", json={"input": ids, "model": "embedder"})
        assert one.status_code == 200 and many.status_code == 200, (one.text, many.text)
        want = [d["embedding"] for d in as_text["data"]]
        np.testing.assert_allclose([d["embedding"] for d in many.json()["data"]], want, atol=1e-6)
        np.testing.assert_allclose(one.json()["data"][0]["embedding"], want[0], atol=1e-6)
        assert many.json()["usage"]["prompt_tokens"] == sum(map(len, ids))
        size = tokenizer.get_vocab_size()
        bad = c.post("/v1/embeddings", json={"input": [ids[0] + [size]], "model": "embedder"})
        assert bad.status_code == 422 and f"token id {size} is not in the model's vocabulary" in \
            bad.json()["error"]["message"], bad.text
        for body in ({"input": [], "model": "embedder"}, {"input": [[]], "model": "embedder"},
                     {"input": [-1], "model": "embedder"}, {"input": ["a", [1]], "model": "embedder"}):
            refused = c.post("/v1/embeddings", json=body)
            assert refused.status_code == 422 and "input" in refused.json()["error"]["message"], (body, refused.text)
        schema = c.get("/openapi.json").json()["components"]["schemas"]["OpenAIEmbeddingRequest"]
        arrays = [v for v in schema["properties"]["input"]["anyOf"] if v.get("type") == "array"]
        assert all("maxItems" not in v for v in arrays if v["items"].get("type") == "integer")  # one input


def test_teis_left_truncation_keeps_an_over_long_texts_last_tokens(artifacts):
    """TEI's truncation_direction Left at /embed: the text's start is cut and its special tokens kept (the model's
    first special token, the text's last tokens, the closing one), as TEI's tokenizer cuts; the served vector is the
    offline one of those tokens. Right (the default) keeps the first tokens. Elsewhere Left is refused by name."""
    from kiln.choices import TruncationSide
    from kiln.data.texts import joined

    predictor = kiln.load(artifacts[TaskName.FEATURE_EXTRACTION])
    room, text = predictor.encoder.max_length, joined(0, 40)
    ids = predictor.encoder.encode([text], truncate=False)[0].ids
    assert len(ids) > room + 10
    assert predictor.encoder.encode([text], side=TruncationSide.LEFT)[0].ids == [ids[0], *ids[len(ids) - room + 1:]]
    assert predictor.encoder.encode([text])[0].ids == [*ids[: room - 1], ids[-1]]
    with client(artifacts, protocols=("tei",)) as c:
        def embed(body):
            answer = c.post("/embed", json={"truncate": True, **body})
            assert answer.status_code == 200, answer.text
            return np.array(answer.json()[0])

        left, right = embed({"inputs": text, "truncation_direction": "Left"}), embed({"inputs": text})
        offline = predictor.predict([text], truncation_side="left", normalize=True)[0]
        np.testing.assert_allclose(left, offline, atol=1e-5)
        np.testing.assert_allclose(right, predictor.predict([text], normalize=True)[0], atol=1e-5)
        assert float(left @ right) < 0.999  # the two ends of 40 sentences are not the same text
        np.testing.assert_allclose(embed({"inputs": text, "truncation_direction": "left"}), left, atol=1e-6)
        schema = c.get("/openapi.json").json()["components"]["schemas"]
        assert schema["TEIEmbedRequest"]["properties"]["truncation_direction"]["enum"] == ["Right", "right", "Left",
                                                                                          "left"]
    with pytest.raises(kiln.UsageError, match="truncation_side must be one of: right, left"):
        predictor.predict([text], truncation_side="middle")


@pytest.mark.parametrize(("task", "path", "body"), [
    (TaskName.SPARSE_EMBEDDING, "/embed_sparse", lambda text: {"inputs": text}),
    (TaskName.TEXT_CLASSIFICATION, "/predict", lambda text: {"inputs": text}),
    (TaskName.TEXT_CLASSIFICATION, "/predict", lambda text: {"inputs": [["a short first text", text]]}),
    (TaskName.TEXT_RANKING, "/rerank", lambda text: {"query": "a short query", "texts": [text, "a short text"],
                                                     "raw_scores": True}),
])
def test_teis_left_truncation_on_every_route(artifacts, task, path, body):
    """TEI's other routes take truncation_direction too: Left answers what the task computes offline with
    truncation_side left (a pair loses tokens from its longer text, at its start), and not what Right answers."""
    from kiln.data.texts import joined

    text = joined(0, 40)
    predictor = kiln.load(artifacts[task])
    with client(artifacts, models={"m": artifacts[task]}, protocols=("tei",)) as c:
        def answer(direction):
            found = c.post(path, json={"truncate": True, "truncation_direction": direction, **body(text)})
            assert found.status_code == 200, found.text
            return found.json()

        left, right = answer("Left"), answer("Right")
    assert left != right  # the over-long text's two ends are different text
    request = body(text)
    if task is TaskName.SPARSE_EMBEDDING:
        offline = predictor.predict([text], truncation_side="left")[0]
        assert [t["index"] for t in left[0]] == list(offline.indices)
        np.testing.assert_allclose([t["value"] for t in left[0]], offline.values, atol=1e-5)
    elif task is TaskName.TEXT_RANKING:
        offline = predictor.predict([RerankQuery(request["query"], tuple(request["texts"]))], raw_scores=True,
                                    truncation_side="left")[0]
        assert [r["index"] for r in left] == [r.index for r in offline]
        np.testing.assert_allclose([r["score"] for r in left], [r.score for r in offline], atol=1e-5)
    else:
        item = request["inputs"] if isinstance(request["inputs"], str) else TextPair(*request["inputs"][0])
        offline = predictor.predict([item], top_k=None, truncation_side="left")[0]
        served = left if isinstance(request["inputs"], str) else left[0]
        assert [p["label"] for p in served][:1] == [offline[0].label]
        np.testing.assert_allclose(sorted(p["score"] for p in served), sorted(p.score for p in offline), atol=1e-5)


def test_teis_raw_scores_are_the_logits_the_probabilities_come_from(artifacts):
    """/predict with raw_scores: each label's logit, the same labels in the same order, and softmax of them gives
    the probabilities /predict answers without it (the model's own function for this single-label model)."""
    text = builtin_sentences()[3]
    with client(artifacts, models={"c": artifacts[TaskName.TEXT_CLASSIFICATION]}, protocols=("tei",)) as c:
        raw = c.post("/predict", json={"inputs": text, "raw_scores": True}).json()
        probabilities = c.post("/predict", json={"inputs": text}).json()
    assert [p["label"] for p in raw] == [p["label"] for p in probabilities]
    logits = np.array([p["score"] for p in raw])
    np.testing.assert_allclose(np.exp(logits) / np.exp(logits).sum(), [p["score"] for p in probabilities], atol=1e-6)
    offline = kiln.load(artifacts[TaskName.TEXT_CLASSIFICATION]).predict([text], top_k=None, raw_scores=True)[0]
    np.testing.assert_allclose(logits, [s.score for s in offline], atol=1e-5)


def test_classify_and_answer_routes(artifacts):
    models = {"cls": artifacts[TaskName.TEXT_CLASSIFICATION], "qa": artifacts[TaskName.QUESTION_ANSWERING]}
    with client(artifacts, models=models) as c:
        cls = c.post("/classify", json={"inputs": ["good", "bad"], "model": "cls", "top_k": None}).json()
        assert len(cls["results"]) == 2 and len(cls["results"][0]) == 3
        item = {"question": "Where?", "context": builtin_sentences()[20]}
        qa = c.post("/answer", json={"model": "qa", "inputs": item, "top_k": 2}).json()
        assert qa["results"][0] and {"answer", "score", "start", "end"} <= qa["results"][0][0].keys()
        unmounted = c.post("/kiln/embed", json={"inputs": "x", "model": "cls"})  # no embedding model: no such route
        assert unmounted.status_code == 404 and unmounted.json()["error"]["type"] == "not_found"
        assert "/classify" in unmounted.json()["error"]["message"]
    with client(artifacts, models={"emb": artifacts[TaskName.FEATURE_EXTRACTION], **models}) as c:
        wrong = c.post("/kiln/embed", json={"inputs": "x", "model": "cls"})
        assert wrong.status_code == 404 and "use /classify" in wrong.json()["error"]["message"]
        missing = c.post("/classify", json={"inputs": "x", "model": "nope"})
        assert missing.status_code == 404 and "served: emb, cls, qa" in missing.json()["error"]["message"]


@pytest.mark.parametrize(("body", "fragment"), [
    ({"inputs": 3}, "inputs"),
    ({"inputs": []}, "inputs: List should have at least 1 item"),
    ({"inputs": ["fine", "  "]}, "inputs.1: must hold a non-blank character"),
    ({"texts": ["wrong field"]}, "inputs: Field required"),
])
def test_bad_requests_get_422_naming_the_field(artifacts, body, fragment):
    with client(artifacts) as c:
        response = c.post("/kiln/embed", json=body)
    assert response.status_code == 422
    assert fragment in response.json()["error"]["message"]


def test_malformed_json_oversized_and_too_long(artifacts):
    with client(artifacts, max_body_bytes=2000) as c:
        broken = c.post("/kiln/embed", content=b'{"inputs": [', headers={"content-type": "application/json"})
        assert broken.status_code == 422 and broken.json()["error"]["type"] == "validation_error"
        big = c.post("/kiln/embed", json={"inputs": ["word " * 1000]})
        assert big.status_code == 413 and "2000-byte limit" in big.json()["error"]["message"]
        long_text = " ".join(builtin_sentences()[:10])
        cut = c.post("/kiln/embed", json={"inputs": long_text})
        assert cut.status_code == 200 and cut.json()["truncated"] == [True]
        refused = c.post("/kiln/embed", json={"inputs": long_text, "truncate": False})
        assert refused.status_code == 413 and "truncate is false" in refused.json()["error"]["message"]


def test_api_key(artifacts):
    with client(artifacts, api_key="s3cret") as c:
        assert c.post("/kiln/embed", json={"inputs": "x"}).status_code == 401
        assert c.post("/kiln/embed", json={"inputs": "x"}, headers={"Authorization": "Bearer nope"}).status_code == 401
        key = {"Authorization": "Bearer s3cret"}
        assert c.post("/kiln/embed", json={"inputs": "x"}, headers=key).status_code == 200
        assert c.get("/health").status_code == 200  # probes stay open


class _Gate:
    """Wraps an engine: blocks until released, or raises, so overload and failure are deterministic."""

    def __init__(self, engine, fail: bool = False) -> None:
        self.engine, self.fail, self.release = engine, fail, threading.Event()
        self.pad_multiple = 1

    def run(self, inputs):
        if self.fail:
            raise RuntimeError("engine exploded")
        self.release.wait(timeout=30)
        return self.engine.run(inputs)


def test_overload_gets_429_with_retry_after(artifacts):
    with client(artifacts, max_concurrent=1) as c:
        predictor = c.app.state.models["embedder"].predictor
        gate = _Gate(predictor.engine)
        predictor.engine = gate
        with ThreadPoolExecutor(1) as pool:
            first = pool.submit(c.post, "/kiln/embed", json={"inputs": "held"})
            for _ in range(200):  # wait until the first request is in flight
                if c.get("/metrics").text.find("kiln_inflight_requests 1.0") >= 0:
                    break
                threading.Event().wait(0.01)
            second = c.post("/kiln/embed", json={"inputs": "refused"})
            gate.release.set()
            assert first.result().status_code == 200
        assert second.status_code == 429 and second.headers["Retry-After"] == "1"
        assert 'kiln_rejections_total{reason="overloaded"} 1.0' in c.get("/metrics").text


def test_a_failed_batch_fails_every_request_in_it_cleanly(artifacts):
    with client(artifacts, limits=BatchLimits(max_delay_s=0.05)) as c:
        predictor = c.app.state.models["embedder"].predictor
        predictor.engine = _Gate(predictor.engine, fail=True)
        with ThreadPoolExecutor(4) as pool:
            responses = list(pool.map(lambda t: c.post("/kiln/embed", json={"inputs": t}), ["a", "b", "c", "d"]))
    assert [r.status_code for r in responses] == [500] * 4
    assert all("Traceback" not in r.text and r.json()["error"]["type"] == "inference_failed" for r in responses)
    assert all("RuntimeError: engine exploded" in r.json()["error"]["message"] for r in responses)


def test_sessions_and_threads_come_from_the_serving_default(artifacts, tmp_path):
    import shutil

    from kiln.benchmarking.job import write_serving_default
    from kiln.records.bench import ServingRecord

    path = tmp_path / "art"
    shutil.copytree(artifacts[TaskName.FEATURE_EXTRACTION], path)
    write_serving_default(path, ServingRecord("onnx-fp32", sessions=2, threads=1, batch_size=4, pad_multiple=8))
    texts = list(builtin_sentences()[:8])
    batches = []
    with client(artifacts, models={"m": path}, sessions=None) as c:
        info = c.get("/kiln/info").json()["models"][0]
        batcher = c.app.state.models["m"].scheduler
        collate = batcher._collate
        batcher._collate = lambda batch: batches.append(collate(batch)["input_ids"].shape) or collate(batch)
        with ThreadPoolExecutor(8) as pool:
            got = list(pool.map(lambda t: c.post("/kiln/embed", json={"inputs": t}).json()["embeddings"][0], texts))
    assert (info["sessions"], info["threads"], info["max_batch_size"], info["pad_multiple"]) == (2, 1, 4, 8)
    assert batches and all(rows <= 4 and width % 8 == 0 for rows, width in batches)
    offline = np.stack(Artifact.open(path).predictor().predict(texts))
    np.testing.assert_allclose(np.array(got), offline, atol=1e-5)


def test_without_a_serving_default_a_server_runs_one_single_thread_session_per_core(artifacts, monkeypatch):
    """Under concurrent load one single-thread session per core beat one session of every thread (2-core AMX Xeon:
    227-240 against 142-180 req/s at 64 clients); the caller's flags and kiln bench's serving default still win."""
    from dataclasses import replace

    import kiln.system.cpu as cpu
    from kiln.serving.inference import server_sessions

    art = Artifact.open(artifacts[TaskName.FEATURE_EXTRACTION])
    variant = art.variant_name()
    real = cpu.cpu_info()
    monkeypatch.setattr(cpu, "cpu_info", lambda: replace(real, usable_cores=4))
    assert server_sessions(art, variant, threads=None, sessions=None)[:3] == (1, 4, 4)
    assert server_sessions(art, variant, threads=None, sessions=None, deterministic=True)[:3] == (1, 4, None)
    assert server_sessions(art, variant, threads=None, sessions=1) == (None, 1, None, "--threads/--sessions")
    assert server_sessions(art, variant, threads=3, sessions=None)[:3] == (3, None, None)
    monkeypatch.setattr(cpu, "cpu_info", lambda: replace(real, usable_cores=1))
    assert server_sessions(art, variant, threads=None, sessions=None) == (None, None, None, "one usable core")
    monkeypatch.setattr(cpu, "cpu_info", lambda: real)
    with client(artifacts, sessions=None) as c:
        info = c.get("/kiln/info").json()["models"][0]
    if real.usable_cores > 1:
        assert (info["sessions"], info["threads"]) == (real.usable_cores, 1)
    else:
        assert info["sessions"] == 1


def test_probes_info_and_openapi(artifacts):
    with client(artifacts) as c:
        assert c.get("/health").json() == {"status": "ok"}
        assert c.get("/ready").json()["ready"] is True
        info = c.get("/kiln/info").json()
        assert info["models"][0]["task"] == "feature-extraction" and info["models"][0]["variant"] == "onnx-fp32"
        assert "/v1/embeddings" in c.get("/openapi.json").json()["paths"]


@pytest.mark.gpu
def test_served_on_the_gpu_matches_offline_results(artifacts):
    """kiln serve --device cuda: one session on ONNX Runtime's CUDA provider (IOBinding), answers equal to the CPU's
    offline ones to fp32 rounding whatever shares a batch."""
    texts = list(builtin_sentences()[:24])
    offline = np.stack(Artifact.open(artifacts[TaskName.FEATURE_EXTRACTION]).predictor().predict(texts))
    limits = BatchLimits(max_batch_tokens=2048, max_batch_size=8, max_delay_s=0.02)
    with client(artifacts, device="cuda", sessions=None, limits=limits) as c:
        info = c.get("/kiln/info").json()["models"][0]
        with ThreadPoolExecutor(16) as pool:
            concurrent = list(pool.map(lambda t: c.post("/kiln/embed", json={"inputs": t}).json()["embeddings"][0],
                                       texts))
    assert (info["device"], info["sessions"]) == ("cuda", 1)
    np.testing.assert_allclose(np.array(concurrent), offline, atol=1e-4)


def test_a_device_the_served_engine_cannot_use_is_refused_before_the_server_starts(artifacts, openvino_artifact):
    """kiln serve --device asks each served model's engine up front: one line and exit 2, not a server whose
    model fails to load after start-up."""
    from tests.conftest import has_cuda

    cases = [(openvino_artifact, "cuda", "--device cuda: kiln runs OpenVINO on the cpu device only")]
    if not has_cuda():
        cases.append((artifacts[TaskName.FEATURE_EXTRACTION], "tensorrt",
                      "--device tensorrt needs TensorrtExecutionProvider, which this onnxruntime build lacks"))
    runs = [subprocess.Popen([sys.executable, "-m", "kiln", "serve", str(path), "--device", device, "--port", "9"],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for path, device, _ in cases]
    for run, (_, _, message) in zip(runs, cases):
        _, err = run.communicate(timeout=120)
        assert run.returncode == 2 and message in " ".join(err.split()) and "Traceback" not in err, err[-2000:]


@pytest.fixture(scope="module")
def openvino_artifact(tiny_model, tmp_path_factory):
    from kiln.optimizing.job import OptimizeConfig, OptimizeJob

    out = tmp_path_factory.mktemp("ov") / "out"
    OptimizeJob(OptimizeConfig(model=str(tiny_model("bert")), task=TaskName.FEATURE_EXTRACTION, output=out,
                               variants=("openvino-fp32",))).run()
    return out / "best"


@pytest.mark.parametrize("engine", ["onnxruntime", "openvino"])
def test_serving_onnx_or_openvino_does_not_import_torch(artifacts, openvino_artifact, engine):
    path = artifacts[TaskName.FEATURE_EXTRACTION] if engine == "onnxruntime" else openvino_artifact
    code = (
        "import sys\nfrom fastapi.testclient import TestClient\nfrom kiln.serving.app import ServeConfig, create_app\n"
        f"app = create_app(ServeConfig(models={{'m': r'{path}'}}))\n"
        "with TestClient(app) as c:\n    assert c.post('/kiln/embed', json={'inputs': 'hi'}).status_code == 200\n"
        "    engine = c.get('/kiln/info').json()['models'][0]['engine']\n"
        "assert 'torch' not in sys.modules, 'torch was imported'\nprint(engine)\n"
    )
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0 and run.stdout.split() == [engine], run.stderr[-2000:]
