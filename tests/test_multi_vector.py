"""The multi-vector (ColBERT) task: kiln's query and document vectors and MaxSim scores against PyLate's on the same
tiny checkpoint (PyTorch and the exported ONNX graph), the routes and their refusals, and kiln optimize end to end."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from fastapi.testclient import TestClient

import kiln
from kiln.errors import UsageError
from kiln.serve.app import ServeConfig, create_app
from kiln.tasks import TaskName
from kiln.tasks.multi_vector import maxsim

PYLATE = Path(__file__).resolve().parents[1] / ".venv-pylate" / "bin" / "python"
QUERIES = ["How do I reset my password?", "a train to Lisbon",
           "what is the capital of the country whose largest river flows north into the sea near the old port"]
DOCUMENTS = ["Please reset my password, it stopped working!", "The train to Lisbon was delayed by two hours.",
             "Cats sleep.", "(a) [b] {c}; d: e! f? g.",
             " ".join(["The river flows north past the old port and the new bridge into the sea."] * 6)]


@pytest.fixture(scope="module")
def colbert(tiny_model) -> Path:
    return tiny_model("bert", TaskName.MULTI_VECTOR)


@pytest.fixture(scope="module")
def pylate(colbert, tmp_path_factory) -> dict[str, np.ndarray]:
    """PyLate 1.6.0's vectors, kept ids and MaxSim scores for QUERIES x DOCUMENTS (run in its own venv)."""
    if not PYLATE.is_file():
        pytest.skip("no PyLate venv (run `make pylate`)")
    scratch = tmp_path_factory.mktemp("pylate")
    (scratch / "in.json").write_text(json.dumps({"queries": QUERIES, "documents": DOCUMENTS}))
    run = subprocess.run([str(PYLATE), str(Path(__file__).parent / "peers" / "pylate_encode.py"), str(colbert),
                          str(scratch / "in.json"), str(scratch / "out.npz")], capture_output=True, text=True,
                         timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    return dict(np.load(scratch / "out.npz"))


def test_kiln_encodes_and_scores_like_pylate(colbert, task_artifacts, pylate):
    """Markers, [MASK] expansion, truncation to the query and document lengths, the punctuation skiplist (a
    document of punctuation keeps only its letters), normalisation and MaxSim: in PyTorch and in the exported
    ONNX graph with the projection inside it."""
    from kiln.model.reference import reference_predictor
    from kiln.model.source import load_source

    pytorch = reference_predictor(load_source(str(colbert), TaskName.MULTI_VECTOR.value))
    for predictor, atol in ((pytorch, 1e-5), (kiln.load(task_artifacts[TaskName.MULTI_VECTOR]), 1e-4)):
        handler = predictor.handler
        for kind, texts, is_query in (("q", QUERIES, True), ("d", DOCUMENTS, False)):
            vectors = predictor.predict(texts, is_query=is_query)
            prepared = predictor.prepare(texts, handler.options(is_query=is_query))
            for i, (mine, feature) in enumerate(zip(vectors, prepared.encodings)):
                kept_ids = np.asarray(feature.ids)[: len(mine)] if is_query else \
                    np.asarray(feature.ids)[~np.isin(feature.ids, handler.config.late_interaction["skiplist_ids"])]
                assert kept_ids.tolist() == pylate[f"{kind}{i}_ids"].tolist(), (kind, i)
                np.testing.assert_allclose(mine, pylate[f"{kind}{i}"], atol=atol)
        assert len(predictor.predict(QUERIES[2:], is_query=True)[0]) == 16  # cut to query_length
        assert predictor.prepare(DOCUMENTS[4:]).truncated == (True,)  # past document_length
        for i, query in enumerate(QUERIES):
            scores = {r.index: r.score for r in predictor.rerank(query, DOCUMENTS)}
            np.testing.assert_allclose([scores[j] for j in range(len(DOCUMENTS))], pylate["scores"][i], rtol=1e-4)


def test_maxsim_is_the_sum_of_each_query_vectors_best_match():
    rng = np.random.default_rng(0)
    query = rng.normal(size=(3, 4)).astype(np.float32)
    documents = [rng.normal(size=(5, 4)).astype(np.float32), rng.normal(size=(1, 4)).astype(np.float32)]
    expected = [sum(max(float(q @ d) for d in doc) for q in query) for doc in documents]
    np.testing.assert_allclose(maxsim(query, documents), expected, rtol=1e-5)
    assert maxsim(query, []).shape == (0,)
    with pytest.raises(UsageError, match="no token vectors"):
        maxsim(query, [np.zeros((0, 4), dtype=np.float32)])


def test_routes_answer_like_offline_and_refuse_bad_input(task_artifacts):
    art = task_artifacts[TaskName.MULTI_VECTOR]
    offline = kiln.load(art)
    with TestClient(create_app(ServeConfig(models={"colbert": art}, max_inputs_per_request=4))) as c:
        queries = c.post("/embed_multi", json={"inputs": QUERIES[:2], "is_query": True}).json()
        document = c.post("/embed_multi", json={"inputs": DOCUMENTS[0], "is_query": False}).json()
        long = c.post("/embed_multi", json={"inputs": QUERIES[2], "is_query": True}).json()
        ranked = c.post("/rerank", json={"query": QUERIES[0], "texts": DOCUMENTS[:4], "top_n": 2}).json()
        errors = {name: c.post(path, json=payload) for name, (path, payload) in {
            "no is_query": ("/embed_multi", {"inputs": ["x"]}),
            "empty": ("/embed_multi", {"inputs": [""], "is_query": True}),
            "pair": ("/embed_multi", {"inputs": [["a", "b"]], "is_query": False}),
            "dimensions": ("/embed_multi", {"inputs": ["x"], "is_query": False, "dimensions": 8}),
            "blank query": ("/rerank", {"query": " ", "texts": DOCUMENTS[:2]}),
            "no texts": ("/rerank", {"query": "q", "texts": []}),
            "many": ("/rerank", {"query": "q", "texts": DOCUMENTS + DOCUMENTS})}.items()}
        schema = c.get("/openapi.json").json()["components"]["schemas"]["EmbedMultiRequest"]
        v2 = c.get("/v2/models/colbert")  # ragged token vectors have no v2 tensors (yet): not a v2 model
    for got, want in zip(queries["embeddings"], offline.predict(QUERIES[:2], is_query=True)):
        np.testing.assert_allclose(got, want, atol=1e-5)
    np.testing.assert_allclose(document["embeddings"][0], offline.predict(DOCUMENTS[:1])[0], atol=1e-5)
    assert queries["truncated"] is False and long["truncated"] is True
    expected = offline.rerank(QUERIES[0], DOCUMENTS[:4], top_n=2)
    assert [r["index"] for r in ranked["results"]] == [r.index for r in expected]
    np.testing.assert_allclose([r["score"] for r in ranked["results"]], [r.score for r in expected], rtol=1e-5)
    assert {k: r.status_code for k, r in errors.items()} == {"no is_query": 422, "empty": 422, "pair": 422,
                                                             "dimensions": 422, "blank query": 422, "no texts": 422,
                                                             "many": 413}
    assert "cannot be cut" in errors["dimensions"].json()["error"]["message"]
    assert "is_query" in errors["no is_query"].json()["error"]["message"]
    assert "is_query" in schema["required"]
    assert v2.status_code == 404 and "not served over v2" in v2.json()["error"]
    triton = subprocess.run([sys.executable, "-m", "kiln", "triton", str(art), "-o", "/tmp/never-written"],
                            capture_output=True, text=True, timeout=120)
    assert triton.returncode == 2 and "multi-vector ensemble" in triton.stderr


def test_kiln_optimize_judges_multi_vector_variants_by_maxsim_ranks(colbert, tmp_path):
    out = tmp_path / "out"
    run = subprocess.run([sys.executable, "-m", "kiln", "optimize", str(colbert), "--task", "multi-vector",
                          "--variants", "onnx-fp32,onnx-int8-dynamic", "--threads", "1", "-o", str(out)],
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    results = {o["name"]: o for o in json.loads((out / "results.json").read_text())["outcomes"]}
    exact = results["onnx-fp32"]["agreement"]
    assert exact["primary"] == "mean_kendall_tau" and exact["value"] > 0.999
    assert exact["figures"]["min_token_cosine"] > 0.9999
    int8 = results["onnx-int8-dynamic"]["agreement"]["figures"]
    assert int8["min_token_cosine"] < 0.99999 and "top3_overlap" in int8  # int8 moves vectors; the gate judges ranks
    assert (out / "report.html").is_file()
    best = kiln.load(out / "best")
    assert [r.index for r in best.rerank(QUERIES[1], DOCUMENTS)][0] == 1  # the Lisbon train, even at random weights


def test_kiln_embed_writes_each_documents_token_vectors(task_artifacts, tmp_path):
    import pyarrow.parquet as pq

    art = task_artifacts[TaskName.MULTI_VECTOR]
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("".join(json.dumps({"text": t}) + "\n" for t in DOCUMENTS))
    run = subprocess.run([sys.executable, "-m", "kiln", "embed", str(art), str(corpus), "-o", str(tmp_path / "out"),
                          "--rows-per-part", "2"], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    rows = [r for part in sorted((tmp_path / "out").glob("part-*.parquet")) for r in
            pq.read_table(part).column("vectors").to_pylist()]
    offline = kiln.load(art).predict(DOCUMENTS)
    assert len(rows) == len(DOCUMENTS)
    for got, want in zip(rows, offline):
        np.testing.assert_allclose(np.array(got), want, atol=1e-6)
    refused = subprocess.run([sys.executable, "-m", "kiln", "embed", str(art), str(corpus), "-o",
                              str(tmp_path / "int8"), "--precision", "int8"], capture_output=True, text=True,
                             timeout=300)
    assert refused.returncode == 2 and "--precision int8 is not supported" in refused.stderr
