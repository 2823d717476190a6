"""BGE-M3's three outputs against FlagEmbedding 1.4.2 itself (its BGEM3FlagModel, in PyLate's venv: make pylate) on
the same tiny directory in FlagEmbedding's layout: dense vectors, lexical weights and ColBERT vectors equal, and so
are its three scores of each query against each document, from kiln's ONNX artifact and from kiln optimize's
accepted variants."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import numpy as np
import pytest

import kiln
from kiln.data.texts import builtin_sentences
from kiln.tasks.hybrid_embedding.validation import similarities
from kiln.testing.factory import build_tiny_bge_m3

PEER = Path(__file__).resolve().parents[2] / ".venv-pylate" / "bin" / "python"
QUERIES = ["what does the cat sit on", builtin_sentences()[3]]
DOCUMENTS = [*builtin_sentences()[:5], "the the the cat sat on the mat", " ".join(builtin_sentences()[10:40])]


@pytest.fixture(scope="module")
def bge_m3(tmp_path_factory) -> Path:
    return build_tiny_bge_m3(tmp_path_factory.mktemp("bge-m3") / "model")


@pytest.fixture(scope="module")
def flagembedding(bge_m3, tmp_path_factory) -> dict:
    if not PEER.is_file():
        pytest.skip("no PyLate venv, which holds FlagEmbedding (run `make pylate`)")
    scratch = tmp_path_factory.mktemp("flagembedding")
    (scratch / "in.json").write_text(json.dumps({"queries": QUERIES, "documents": DOCUMENTS}))
    run = subprocess.run([str(PEER), str(Path(__file__).parents[1] / "peers" / "flagembedding_encode.py"),
                          str(bge_m3), str(scratch / "in.json"), str(scratch / "out.json")], capture_output=True,
                         text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    return json.loads((scratch / "out.json").read_text())


def _scores(results) -> dict[str, list[float]]:
    """FlagEmbedding's three scores of each query against each document, from kiln's outputs."""
    queries, documents = results[: len(QUERIES)], results[len(QUERIES):]
    rows = [similarities(q, d) for q in queries for d in documents]
    return {theirs: [r[ours] for r in rows] for theirs, ours in (("dense", "dense"), ("sparse", "sparse"),
                                                                  ("colbert", "multi"))}


def _assert_like_flagembedding(results, theirs, atol):
    for i, got in enumerate(results):
        np.testing.assert_allclose(got.dense, theirs["dense"][i], atol=atol)
        assert {str(k): v for k, v in zip(got.sparse.indices, got.sparse.values)} == \
            pytest.approx(theirs["sparse"][i], abs=atol)
        np.testing.assert_allclose(got.multi, theirs["multi"][i], atol=atol)
    for mode, scores in _scores(results).items():
        np.testing.assert_allclose(scores, theirs["scores"][mode], atol=atol)


def test_kilns_artifact_answers_as_flagembedding(bge_m3, flagembedding, tmp_path):
    art = kiln.export(str(bge_m3), task="hybrid-embedding", output=tmp_path / "art").artifact.path
    _assert_like_flagembedding(kiln.load(art).predict(QUERIES + DOCUMENTS, output="all"), flagembedding, 2e-5)


def test_optimized_variants_answer_as_flagembedding(bge_m3, flagembedding, tmp_path):
    """kiln optimize's fp32 variants reproduce FlagEmbedding (atol as export parity's); int8's figures on random
    weights say only that the gate judged all three outputs."""
    result = kiln.optimize(str(bge_m3), task="hybrid-embedding", output=tmp_path / "out",
                           variants=["onnx-fp32", "openvino-fp32", "onnx-int8-dynamic"])
    outcomes = {o.name: o for o in result.summary.outcomes}
    for name in ("onnx-fp32", "openvino-fp32"):
        assert outcomes[name].status == "accepted", outcomes[name]
        figures = outcomes[name].agreement.figures
        assert min(figures[f"{m}_min_cosine"] for m in ("dense", "sparse", "multi")) > 0.9999
        variant = kiln.load(tmp_path / "out", variant=name)
        _assert_like_flagembedding(variant.predict(QUERIES + DOCUMENTS, output="all"), flagembedding, 1e-4)
    int8 = outcomes["onnx-int8-dynamic"].agreement.figures
    assert {"dense_min_cosine", "sparse_min_cosine", "multi_min_cosine", "sparse_top10_term_overlap"} <= set(int8)
