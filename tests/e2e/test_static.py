"""kiln distill --static: a static-embedding model from a teacher, in sentence-transformers' format, whose vectors
sentence-transformers and kiln's numpy reading agree on; deterministic; bad options refused."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from kiln.compress.static import LINEAGE_FILE, encode_static, principal_components, sif_weights
from kiln.data.texts import builtin_sentences
from kiln.tasks import TaskName


def _distill(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "kiln", "distill", *args], capture_output=True, text=True,
                          timeout=300)


def test_a_static_student_loads_in_sentence_transformers_and_agrees_with_kiln(tiny_model, static_run, tmp_path):
    from safetensors.numpy import load_file
    from sentence_transformers import SentenceTransformer
    from transformers import AutoTokenizer

    teacher = tiny_model("bert")
    static, run = static_run
    assert "dimensions" in run.stdout and "of the variance" in run.stdout
    texts = list(builtin_sentences()[:8]) + ["", "x"]
    theirs = SentenceTransformer(str(static), device="cpu").encode(texts)
    ours = encode_static(static, texts)
    assert theirs.shape == (len(texts), 16)
    np.testing.assert_allclose(ours[:-2], theirs[:-2], atol=1e-6)
    table = load_file(str(static / "model.safetensors"))["embedding.weight"]
    tokenizer = AutoTokenizer.from_pretrained(teacher)
    assert not table[tokenizer.all_special_ids].any()  # special tokens get no row: they carry no meaning alone
    lineage = json.loads((static / LINEAGE_FILE).read_text())
    assert lineage["recipe"]["dims"] == 16 and lineage["teacher"] and 0 < lineage["explained_variance"] <= 1
    again = _distill(str(teacher), "--static", "--dims", "16", "-o", str(tmp_path / "again"))
    assert again.returncode == 0 and np.array_equal(
        table, load_file(str(tmp_path / "again" / "model.safetensors"))["embedding.weight"])


def test_the_recipe_pieces():
    rng = np.random.default_rng(0)
    vectors = rng.normal(size=(200, 12)) @ np.diag(np.linspace(3, 0.1, 12))
    reduced, explained = principal_components(vectors.astype(np.float32), 4)
    assert reduced.shape == (200, 4) and 0.5 < explained < 1
    variances = reduced.var(axis=0)
    assert np.all(np.diff(variances) <= 1e-6)  # components in order of the variance they hold
    weights = sif_weights(1000, 1e-4)
    assert weights[0] < weights[10] < weights[-1] < 1  # frequent (low-rank) tokens weigh less


def test_bad_static_options_are_one_clear_error(tiny_model, tmp_path):
    wrong_task = _distill(str(tiny_model("bert")), "--static", "--task", TaskName.TEXT_CLASSIFICATION.value,
                          "-o", str(tmp_path / "x"))
    assert wrong_task.returncode == 2 and "--static distils a sentence-embedding model" in wrong_task.stderr
    zero = _distill(str(tiny_model("bert")), "--static", "--dims", "0", "-o", str(tmp_path / "y"))
    assert zero.returncode == 2 and "--dims" in zero.stderr


def test_the_static_artifact_serves_what_sentence_transformers_computes(static_dir, tmp_path):
    """The artifact kiln distill --static writes beside the model: kiln.load().encode(), kiln serve and kiln embed
    give sentence-transformers' vectors (a table lookup and a mean; no ONNX, no torch)."""
    import httpx
    from sentence_transformers import SentenceTransformer

    import kiln
    from kiln.serving import process
    from kiln.serving.app import ServeConfig, create_app

    out = static_dir
    texts = list(builtin_sentences()[:10])
    theirs = SentenceTransformer(str(out), device="cpu").encode(texts)
    predictor = kiln.load(out / "artifact")
    np.testing.assert_allclose(predictor.encode(texts), theirs, atol=1e-6)
    with process.serve_in_thread(create_app(ServeConfig(models={"s": out / "artifact"}))) as base:
        served = np.array(httpx.post(f"{base}/kiln/embed", json={"inputs": texts}).json()["embeddings"])
        tokens = httpx.post(f"{base}/embed_all", json={"inputs": texts})  # a table has no token states: said so
    np.testing.assert_allclose(served, theirs, atol=1e-6)
    assert tokens.status_code == 422 and "engine pools inside" in tokens.json()["error"], tokens.text
    with pytest.raises(kiln.UsageError, match="engine pools inside"):
        predictor.encode(texts, output_value="token_embeddings")
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    run = subprocess.run([sys.executable, "-m", "kiln", "embed", str(out / "artifact"), str(corpus), "-o",
                          str(tmp_path / "vectors")], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    import pyarrow.parquet as pq

    stored = np.array(pq.read_table(tmp_path / "vectors" / "part-00000.parquet").column("vector").to_pylist())
    np.testing.assert_allclose(stored, theirs, atol=1e-6)


@pytest.fixture(scope="module")
def static_run(tiny_model, tmp_path_factory) -> tuple[Path, subprocess.CompletedProcess]:
    """A 16-dimension static student of the tiny BERT, distilled once by the CLI for this module's tests (each
    distil is a process importing torch and transformers): (its directory, the run). Read-only."""
    out = tmp_path_factory.mktemp("static") / "static"
    run = _distill(str(tiny_model("bert")), "--static", "--dims", "16", "-o", str(out))
    assert run.returncode == 0, run.stderr
    return out, run


@pytest.fixture(scope="module")
def static_dir(static_run) -> Path:
    return static_run[0]


def _optimize(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "kiln", "optimize", *args], capture_output=True, text=True,
                          timeout=600)


def test_kiln_optimize_judges_a_static_student_against_its_teacher(tiny_model, static_dir, tmp_path):
    """Its own space: no cosine to the teacher, so the gate judges the Spearman of every pair's similarity, which
    is recomputed here from sentence-transformers' vectors of the student and scipy's Spearman."""
    from scipy.stats import spearmanr
    from sentence_transformers import SentenceTransformer

    import kiln
    from kiln.artifact.directory import Artifact
    from kiln.records.artifact import Status
    from kiln.source.loading import load_source
    from kiln.source.reference import reference_predictor
    from kiln.tasks import task_spec

    teacher = tiny_model("bert")
    strict = _optimize(str(static_dir), "--reference", str(teacher), "-o", str(tmp_path / "strict"))
    assert strict.returncode == 4 and "pairwise_spearman" in strict.stderr and "< 0.9900" in strict.stderr
    assert not (tmp_path / "strict").exists()  # nothing half-written

    out = tmp_path / "judged"
    run = _optimize(str(static_dir), "--reference", str(teacher), "--tolerance", "0.95", "--precisions", "int8",
                    "--retrieval-tolerance", "0.1", "-o", str(out))
    assert run.returncode == 0, run.stderr
    artifact = Artifact.open(out)
    record, build = artifact.manifest.variants["static"], artifact.manifest.build
    assert record.status is Status.ACCEPTED and build.best == "static" and (out / "best" / "manifest.json").is_file()
    assert build.reference.path == str(teacher) and build.reference_timing.sequences == record.timing.sequences
    assert "min_cosine" not in record.agreement.figures  # no cosine between two spaces
    assert record.batched.drift.invariant  # a gather and a mean: the same bits in any batch

    reference = reference_predictor(load_source(str(teacher), TaskName.FEATURE_EXTRACTION.value))
    texts = task_spec(TaskName.FEATURE_EXTRACTION.value).validation.agreement_inputs(reference.encoder)
    theirs = np.stack(reference.predict(texts)).astype(np.float64)
    mine = SentenceTransformer(str(static_dir), device="cpu").encode(texts).astype(np.float64)
    upper = np.triu_indices(len(texts), k=1)

    def similarities(x: np.ndarray) -> np.ndarray:
        # A short query of tokens the static table lacks embeds to zeros: similar to nothing (0), not NaN.
        x = x / np.clip(np.linalg.norm(x, axis=1, keepdims=True), 1e-12, None)
        return (x @ x.T)[upper]

    expected = spearmanr(similarities(theirs), similarities(mine)).statistic
    assert record.agreement.figures["pairwise_spearman"] == pytest.approx(expected, abs=1e-6)
    assert "pairwise_spearman" in (out / "summary.md").read_text()
    # what the artifact serves: the student's vectors, with output precision from its own calibration
    served = kiln.load(out)
    np.testing.assert_allclose(served.encode(texts[:4]), mine[:4], atol=1e-6)
    assert served.encode(texts[:4], precision="int8").dtype == np.int8
    assert {s.precision for s in build.stored_vectors} >= {"float32", "int8"}


def test_judging_a_static_model_refuses_what_it_cannot_do(tiny_model, static_dir, tmp_path):
    from kiln.api.build import optimize
    from kiln.errors import UsageError

    teacher = tiny_model("bert")
    no_reference = _optimize(str(static_dir), "-o", str(tmp_path / "a"))
    assert no_reference.returncode == 2 and "pass --reference TEACHER" in no_reference.stderr
    for kwargs, message in (
            ({"task": TaskName.TEXT_CLASSIFICATION.value}, "a static model embeds text"),
            ({"variants": ["onnx-fp32"]}, "variants: a static model has one variant"),
            ({"matryoshka_dims": [8]}, "matryoshka_dims: a static table's size is chosen"),
            ({"distill_layers": [1]}, "a static model has no students")):
        with pytest.raises(UsageError, match=message):
            optimize(static_dir, reference=teacher, output=tmp_path / "b", **kwargs)
    with pytest.raises(UsageError, match="its vocabulary differs"):
        optimize(static_dir, reference=tiny_model("roberta"), output=tmp_path / "c")
    assert not (tmp_path / "b").exists() and not (tmp_path / "c").exists()


def test_a_static_student_takes_its_place_on_the_frontier(tiny_model, tmp_path):
    out = tmp_path / "out"
    run = _optimize(str(tiny_model("bert")), "--variants", "onnx-fp32", "--static-dims", "8", "--threads", "1",
                    "-o", str(out))
    assert run.returncode == 0, run.stderr
    frontier = json.loads((out / "frontier.json").read_text())
    assert frontier["primary"] == "pairwise_spearman"  # the figure a static student shares with the rest
    points = {(p["model"], p["variant"]): p for p in frontier["points"]}
    static, exact = points[("static 8d", "static")], points[("model", "onnx-fp32")]
    assert static["speedup"] is not None and static["status"] == "rejected"  # the default tolerance: too far
    results = json.loads((out / "results.json").read_text())
    fp32 = next(o for o in results["outcomes"] if o["name"] == "onnx-fp32")
    assert exact["agreement"] == fp32["agreement"]["figures"]["pairwise_spearman"] and exact["status"] == "accepted"
    assert (out / "students" / "static-8" / "model" / "modules.json").is_file()
