"""Output precision (issue 28, part 1): int8/uint8/binary/ubinary vectors, bit for bit what sentence-transformers'
quantize_embeddings makes with the same ranges, with ranges from the artifact's calibration everywhere a user gets
vectors (encode, /embed, /v1/embeddings), composed with Matryoshka dimensions; bad values are one clear error."""

from __future__ import annotations

import base64

import httpx
import numpy as np
import pytest

import kiln
from kiln.data.texts import builtin_sentences
from kiln.runtime.precision import CALIBRATION_FILE, Precision, quantize, ranges_of
from kiln.serving import process
from kiln.serving.app import ServeConfig, create_app
from kiln.tasks import TaskName

TEXTS = list(builtin_sentences()[:12])
PRECISIONS = ["int8", "uint8", "binary", "ubinary"]


@pytest.fixture(scope="module")
def optimized(tiny_model, tmp_path_factory):
    """A tiny embedding model through kiln optimize (onnx-fp32 only): the artifact stores its output calibration."""
    from kiln.optimizing.job import OptimizeConfig, OptimizeJob

    out = tmp_path_factory.mktemp("precision") / "opt"
    OptimizeJob(OptimizeConfig(model=str(tiny_model("bert")), task=TaskName.FEATURE_EXTRACTION, output=out,
                               variants=("onnx-fp32",))).run()
    return out


@pytest.mark.parametrize("precision", PRECISIONS)
def test_quantize_is_sentence_transformers_bit_for_bit(precision):
    from sentence_transformers.util.quantization import quantize_embeddings

    rng = np.random.default_rng(0)
    vectors = rng.normal(size=(40, 24)).astype(np.float32)
    ranges = ranges_of(rng.normal(size=(100, 24)))
    ours = quantize(vectors, Precision(precision), ranges)
    theirs = quantize_embeddings(vectors, precision, ranges=ranges)
    assert ours.dtype == theirs.dtype and np.array_equal(ours, theirs)
    assert ours.shape[1] == (24 if precision.endswith("int8") else 3)


def test_the_artifact_keeps_its_calibration_and_encode_quantizes_with_it(optimized):
    from sentence_transformers.util.quantization import quantize_embeddings

    for directory in (optimized, optimized / "best"):
        assert (directory / CALIBRATION_FILE).is_file()
    predictor = kiln.load(optimized / "best")
    calibration = np.load(optimized / CALIBRATION_FILE)
    assert calibration.dtype == np.float32 and calibration.shape[0] >= 64
    full = predictor.encode(TEXTS)
    for precision in PRECISIONS:
        got = predictor.encode(TEXTS, precision=precision)
        want = quantize_embeddings(full, precision, ranges=ranges_of(calibration))
        assert got.dtype == want.dtype and np.array_equal(got, want), precision
        cut = predictor.encode(TEXTS, precision=precision, truncate_dim=16, normalize_embeddings=True)
        cut_float = predictor.encode(TEXTS, truncate_dim=16, normalize_embeddings=True)
        assert np.array_equal(cut, quantize_embeddings(cut_float, precision,
                                                       ranges=ranges_of(calibration, 16, normalize=True)))
    single = predictor.encode(TEXTS[0], precision="int8")  # a text alone gets the same bytes as in a batch
    assert np.array_equal(single, predictor.encode(TEXTS, precision="int8")[0])


def test_every_route_answers_each_precision(optimized):
    predictor = kiln.load(optimized / "best")
    with process.serve_in_thread(create_app(ServeConfig(models={"m": optimized / "best"}))) as base:
        for precision in PRECISIONS:
            want = predictor.encode(TEXTS, precision=precision)
            own = httpx.post(f"{base}/kiln/embed", json={"inputs": TEXTS, "precision": precision}).json()
            assert np.array_equal(np.array(own["embeddings"], dtype=want.dtype), want), precision
            openai = httpx.post(f"{base}/v1/embeddings", json={"input": TEXTS, "model": "m", "precision": precision,
                                                               "encoding_format": "base64"}).json()
            raw = [np.frombuffer(base64.b64decode(d["embedding"]), dtype=want.dtype) for d in openai["data"]]
            assert np.array_equal(np.stack(raw), want), precision
        # Matryoshka then precision: cut, re-normalise as the route does, then quantize
        cut = httpx.post(f"{base}/kiln/embed", json={"inputs": TEXTS, "dimensions": 16, "precision": "uint8"}).json()
        floats = np.array(httpx.post(f"{base}/kiln/embed", json={"inputs": TEXTS, "dimensions": 16}
                                     ).json()["embeddings"])
        calibration = np.load(optimized / CALIBRATION_FILE)
        normalizes = kiln.load(optimized / "best").config.normalize
        assert np.array_equal(np.array(cut["embeddings"], dtype=np.uint8),
                              quantize(floats.astype(np.float32), Precision.UINT8,
                                       ranges_of(calibration, 16, normalize=normalizes)))
        base64_floats = httpx.post(f"{base}/v1/embeddings", json={"input": TEXTS[:1], "model": "m",
                                                                  "encoding_format": "base64"}).json()
        assert np.allclose(np.frombuffer(base64.b64decode(base64_floats["data"][0]["embedding"]), dtype="<f4"),
                           predictor.encode(TEXTS[0]), atol=1e-6)
        unknown = httpx.post(f"{base}/kiln/embed", json={"inputs": "x", "precision": "int4"})
        assert unknown.status_code == 422 and "precision" in unknown.json()["error"]["message"]


def test_precisions_that_cannot_be_honoured_are_refused(tiny_artifact, task_artifacts):
    """An exported artifact (no calibration) refuses int8/uint8 but gives binary; a classifier takes no precision."""
    from kiln.errors import UsageError

    predictor = kiln.load(tiny_artifact)
    with pytest.raises(UsageError, match="output calibration, which this artifact has none of"):
        predictor.encode(TEXTS, precision="int8")
    with pytest.raises(UsageError, match="precision must be one of: float32, int8, uint8, binary, ubinary"):
        predictor.encode(TEXTS, precision="int4")
    assert predictor.encode(TEXTS, precision="ubinary").dtype == np.uint8
    with process.serve_in_thread(create_app(ServeConfig(models={
            "m": tiny_artifact, "c": task_artifacts[TaskName.TEXT_CLASSIFICATION]}))) as base:
        refused = httpx.post(f"{base}/kiln/embed", json={"inputs": "x", "precision": "uint8", "model": "m"})
        assert refused.status_code == 422 and "kiln optimize stores it" in refused.json()["error"]["message"]
        classify = httpx.post(f"{base}/classify", json={"inputs": "x", "precision": "int8"})
        assert classify.status_code == 422 and "precision" in classify.json()["error"]["message"]


def test_kiln_embed_stores_each_precision(optimized, tmp_path):
    import json
    import subprocess
    import sys

    import pyarrow.parquet as pq

    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("".join(json.dumps({"text": t}) + "\n" for t in TEXTS))
    predictor = kiln.load(optimized / "best")
    for precision, dtype in (("int8", np.int8), ("ubinary", np.uint8)):
        out = tmp_path / precision
        run = subprocess.run([sys.executable, "-m", "kiln", "embed", str(optimized / "best"), str(corpus), "-o",
                              str(out), "--precision", precision], capture_output=True, text=True, timeout=300)
        assert run.returncode == 0, run.stderr
        table = pq.read_table(out / "part-00000.parquet")
        stored = np.array(table.column("vector").to_pylist(), dtype=dtype)
        assert str(table.schema.field("vector").type.value_type) == np.dtype(dtype).name
        assert np.array_equal(stored, predictor.encode(TEXTS, precision=precision)), precision
    bad = subprocess.run([sys.executable, "-m", "kiln", "embed", str(optimized / "best"), str(corpus), "-o",
                          str(tmp_path / "bad"), "--precision", "int4"], capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and "--precision must be one of: float32, int8, uint8, binary, ubinary" in bad.stderr


def test_optimize_measures_what_each_stored_size_and_precision_costs(tiny_model, tmp_path):
    """--precisions with --matryoshka-dims: a row per (size, precision, search), gated; the rejected ones are refused
    by kiln serve and encode(), the accepted ones served."""
    from kiln.artifact.directory import Artifact
    from kiln.errors import UsageError
    from kiln.optimizing.job import OptimizeConfig, OptimizeJob

    out = tmp_path / "opt"
    OptimizeJob(OptimizeConfig(model=str(tiny_model("bert")), task=TaskName.FEATURE_EXTRACTION, output=out,
                               variants=("onnx-fp32",), precisions=("int8", "binary"), matryoshka_dims=(16,),
                               retrieval_tolerance=0.05)).run()
    rows = Artifact.open(out / "best").manifest.build.stored_vectors
    assert [(r.dimensions, r.precision, r.search) for r in rows] == [
        (size, precision, search) for size in (32, 16) for precision, search in (
            ("float32", "cosine"), ("int8", "decoded cosine"), ("int8", "raw inner product"), ("binary", "hamming"),
            ("binary", "hamming + int8 rescoring (4x)"), ("binary", "hamming + int8 rescoring (10x)"))]
    full = rows[0]
    assert full.recall_at_10 == 1.0 and full.accepted and full.bytes_per_vector == 128
    assert rows[3].bytes_per_vector == 4 and all(r.queries_per_s > 0 for r in rows)
    assert all(r.accepted == (r.recall_at_10 >= 0.95) for r in rows)
    assert "## Stored vectors: size x precision" in (out / "summary.md").read_text()
    assert "Stored vectors: size x precision" in (out / "report.html").read_text()
    verdicts: dict[tuple[int, str], bool] = {}
    for r in rows:
        verdicts[(r.dimensions, r.precision)] = verdicts.get((r.dimensions, r.precision), False) or r.accepted
    rejected = [key for key, ok in verdicts.items() if not ok]
    assert rejected, rows  # a random 32-dimensional model loses neighbours in 2 bytes of bits
    size, precision = rejected[0]
    with process.serve_in_thread(create_app(ServeConfig(models={"m": out / "best"}))) as base:
        refused = httpx.post(f"{base}/kiln/embed", json={"inputs": "x", "dimensions": size, "precision": precision})
        fine = httpx.post(f"{base}/kiln/embed", json={"inputs": "x"})
    assert refused.status_code == 422 and "lost too much retrieval quality" in refused.json()["error"]["message"]
    assert fine.status_code == 200
    if size == 32:
        with pytest.raises(UsageError, match="lost too much retrieval quality"):
            kiln.load(out / "best").encode(["x"], precision=precision)


def test_eval_judgements_give_each_stored_size_and_precision_an_ndcg(tiny_model, tmp_path):
    """--eval rows of query, text, relevance (a reranker's format): the task metric reads them as pairs, and the
    stored-vector table ranks every text for each query at each size and precision (NDCG@10), the float32 row
    recomputed here from the served vectors and kiln's scores-based NDCG."""
    import json

    from kiln.artifact.directory import Artifact
    from kiln.optimizing.job import OptimizeConfig, OptimizeJob
    from kiln.scoring import ndcg_at_k

    sentences = list(builtin_sentences()[:60])
    queries, texts = sentences[:12], sentences[12:]
    rows = []
    for i, query in enumerate(queries):
        rows.append({"query": query, "text": query + " Indeed.", "relevance": 2})  # its near copy: most relevant
        rows += [{"query": query, "text": texts[(3 * i + j) % len(texts)], "relevance": j % 2} for j in range(4)]
    judgements = tmp_path / "judgements.jsonl"
    judgements.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "opt"
    OptimizeJob(OptimizeConfig(model=str(tiny_model("bert")), task=TaskName.FEATURE_EXTRACTION, output=out,
                               variants=("onnx-fp32",), precisions=("int8", "binary"), eval_file=judgements,
                               retrieval_tolerance=0.5)).run()
    artifact = Artifact.open(out / "best")
    stored = artifact.manifest.build.stored_vectors
    assert all(r.ndcg_at_10 is not None and 0 <= r.ndcg_at_10 <= 1 for r in stored)
    assert all(r.accepted == (r.recall_at_10 >= 0.5 and stored[0].ndcg_at_10 - r.ndcg_at_10 <= 0.5) for r in stored)
    documents = list(dict.fromkeys(r["text"] for r in rows))
    relevance = {(r["query"], r["text"]): r["relevance"] for r in rows}
    served = kiln.load(out / "best")
    q, d = (v / np.linalg.norm(v, axis=1, keepdims=True) for v in (served.encode(queries), served.encode(documents)))
    expected = np.mean([ndcg_at_k(q[i] @ d.T, [relevance.get((query, t), 0) for t in documents])
                        for i, query in enumerate(queries)])
    assert stored[0].precision == "float32" and stored[0].ndcg_at_10 == pytest.approx(expected, abs=1e-9)
    assert "NDCG@10" in (out / "summary.md").read_text() and "NDCG@10" in (out / "report.html").read_text()
    whole = Artifact.open(out).manifest  # the task metric came from the same rows, read as pairs
    assert whole.build.eval is not None and whole.build.eval.startswith(str(judgements))
    assert "spearman" in whole.variants["onnx-fp32"].task_metric


def test_bad_relevance_is_one_clear_error(tmp_path):
    from kiln.errors import UsageError
    from kiln.validation.evalsets import load_eval_set

    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"query": "q", "text": "t", "relevance": -1}\n')
    with pytest.raises(UsageError, match="relevance' must be 0 or more"):
        load_eval_set(bad, TaskName.FEATURE_EXTRACTION.value)
