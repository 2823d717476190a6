"""Retrieval workloads (issue 13): Matryoshka sizes, rerankers, sparse embeddings, long documents."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
from fastapi.testclient import TestClient

import kiln
from kiln.artifact.directory import Artifact
from kiln.errors import UsageError
from kiln.optimize.job import OptimizeConfig, OptimizeJob
from kiln.serve.app import ServeConfig, create_app
from kiln.serve.batcher import BatchLimits
from kiln.tasks import TaskName
from kiln.tasks.rerank import Rerank
from kiln.validation.metrics import kendall_tau, ndcg_at_k, reciprocal_rank


def test_matryoshka_sizes_are_validated_gated_and_recorded(tiny_model, tmp_path):
    out = tmp_path / "out"
    summary = OptimizeJob(OptimizeConfig(model=str(tiny_model("bert")), task=TaskName.FEATURE_EXTRACTION, output=out,
                                         variants=("onnx-fp32", "onnx-int8-dynamic"), matryoshka_dims=(8, 16))).run()
    for outcome in summary.outcomes:
        figures = outcome.agreement.figures
        assert {"min_cosine@16", "mean_cosine@16", "min_cosine@8", "mean_cosine@8"} <= figures.keys()
    assert summary.outcomes[0].agreement.figures["min_cosine@8"] == pytest.approx(1.0, abs=1e-5)
    # A cut vector agrees less than the whole one under int8 noise, never more than it can (a check on the sums).
    assert all(0 < v <= 1 + 1e-6 for k, v in summary.outcomes[1].agreement.figures.items() if "@" in k)
    assert Artifact.open(out).task_config.matryoshka_dims == (16, 8)
    assert json.loads((out / "manifest.json").read_text())["task"]["dimension"] == 32


def test_matryoshka_sizes_larger_than_the_model_or_on_other_tasks_are_refused(tiny_model, tmp_path):
    with pytest.raises(UsageError, match=r"--matryoshka-dims must be at most the embedding size 32 .* \(got 64\)"):
        OptimizeJob(OptimizeConfig(model=str(tiny_model("bert")), task=TaskName.FEATURE_EXTRACTION,
                                   output=tmp_path / "o", variants=("onnx-fp32",), matryoshka_dims=(64,))).run()
    with pytest.raises(UsageError, match="--matryoshka-dims applies to embedding tasks"):
        OptimizeConfig(model=None, task=TaskName.TEXT_CLASSIFICATION, output=tmp_path, matryoshka_dims=(8,))


# -- rerank --------------------------------------------------------------------------------------------------------
QUERY = "How do I read a file line by line?"
DOCS = ["Open the file and iterate over it: each step gives one line.", "The weather was mild for the season.",
        "Return the lowest index in the string where substring sub is found.", "Lines end with a newline character.",
        "A list is a mutable sequence."]


def _torch_scores(model_dir, query: str, texts: list[str]) -> np.ndarray:
    """The cross-encoder's logit for each (query, text) pair, straight from transformers."""
    import torch
    import transformers

    tokenizer = transformers.AutoTokenizer.from_pretrained(model_dir)
    model = transformers.AutoModelForSequenceClassification.from_pretrained(model_dir).eval()
    with torch.no_grad():
        batch = tokenizer([query] * len(texts), texts, padding=True, truncation=True, return_tensors="pt")
        return model(**batch).logits[:, 0].numpy()


def test_rerank_offline_matches_the_pytorch_cross_encoder(tiny_model, task_artifacts):
    logits = _torch_scores(tiny_model("bert", TaskName.TEXT_RANKING), QUERY, DOCS)
    predictor = kiln.load(task_artifacts[TaskName.TEXT_RANKING])
    ranked = predictor.rerank(QUERY, DOCS, return_documents=True)
    assert [r.index for r in ranked] == list(np.argsort(-logits, kind="stable"))
    np.testing.assert_allclose([r.score for r in ranked], 1 / (1 + np.exp(-np.sort(logits)[::-1])), atol=1e-5)
    assert [r.text for r in ranked] == [DOCS[r.index] for r in ranked]
    raw = predictor.rerank(QUERY, DOCS, raw_scores=True, top_n=2)
    assert len(raw) == 2 and raw[0].text is None
    np.testing.assert_allclose([r.score for r in raw], np.sort(logits)[::-1][:2], atol=1e-5)
    with pytest.raises(UsageError, match="top_n must be at least 1"):
        predictor.rerank(QUERY, DOCS, top_n=0)
    with pytest.raises(UsageError, match="texts must hold at least one text"):
        predictor.rerank(QUERY, [])
    with pytest.raises(UsageError, match=r"rerank\(\) needs a reranker artifact"):
        kiln.load(task_artifacts[TaskName.TEXT_CLASSIFICATION]).rerank(QUERY, DOCS)


def test_rerank_route_answers_like_offline_and_batches_pairs_across_requests(task_artifacts):
    art = task_artifacts[TaskName.TEXT_RANKING]
    offline = kiln.load(art).rerank(QUERY, DOCS)
    config = ServeConfig(models={"ranker": art}, max_inputs_per_request=8,
                         limits=BatchLimits(max_batch_tokens=4096, max_batch_size=64, max_delay_s=0.05))
    with TestClient(create_app(config)) as c:
        body = c.post("/rerank", json={"query": QUERY, "texts": DOCS, "return_documents": True}).json()
        top = c.post("/rerank", json={"query": QUERY, "texts": DOCS, "top_n": 1}).json()
        with ThreadPoolExecutor(8) as pool:
            together = list(pool.map(lambda _: c.post("/rerank", json={"query": QUERY, "texts": DOCS}).json(),
                                     range(8)))
        metrics = c.get("/metrics").text
        errors = {name: c.post("/rerank", json=payload) for name, payload in {
            "empty": {"query": QUERY, "texts": []}, "top_n": {"query": QUERY, "texts": DOCS, "top_n": 0},
            "blank": {"query": " ", "texts": DOCS}, "many": {"query": QUERY, "texts": DOCS * 2}}.items()}
        schema = c.get("/openapi.json").json()["components"]["schemas"]["RerankRequest"]["properties"]
    assert [(r["index"], r["text"]) for r in body["results"]] == [(r.index, DOCS[r.index]) for r in offline]
    np.testing.assert_allclose([r["score"] for r in body["results"]], [r.score for r in offline], atol=1e-5)
    assert body["model"] == "ranker" and body["truncated"] is False
    assert [r["index"] for r in top["results"]] == [offline[0].index] and top["results"][0]["text"] is None
    assert all([r["index"] for r in t["results"]] == [r.index for r in offline] for t in together)
    batches = float(next(line.split()[-1] for line in metrics.splitlines() if line.startswith("kiln_batch_size_count")))
    assert batches < 2 + 8  # the 8 concurrent requests' 40 pairs shared batches
    assert {k: r.status_code for k, r in errors.items()} == {"empty": 422, "top_n": 422, "blank": 422, "many": 413}
    assert "texts" in errors["empty"].json()["error"]["message"]
    assert "10 inputs in one request; the limit is 8" in errors["many"].json()["error"]["message"]
    assert schema["texts"]["maxItems"] == 8 and schema["texts"]["minItems"] == 1


def test_ranking_metrics():
    assert ndcg_at_k([3, 2, 1], [1, 0, 0]) == pytest.approx(1.0)
    assert ndcg_at_k([1, 2, 3], [1, 0, 0]) == pytest.approx(0.5)  # the relevant text at rank 3: 1/log2(4)
    assert ndcg_at_k([1, 2, 3], [0, 0, 0]) == 0.0
    assert reciprocal_rank([0.1, 0.9, 0.5], [1, 0, 0]) == pytest.approx(1 / 3)
    assert reciprocal_rank([0.1, 0.9], [0, 0]) == 0.0
    assert kendall_tau([1, 2, 3], [10, 20, 30]) == pytest.approx(1.0)
    assert kendall_tau([1, 2, 3], [3, 2, 1]) == pytest.approx(-1.0)


def test_optimize_a_reranker_reports_rank_agreement_and_ndcg(tiny_model, tmp_path):
    eval_file = tmp_path / "qrels.jsonl"
    rows = [{"query": q, "text": t, "relevance": int(j == i % 3)}
            for i, q in enumerate(("read a file", "sort a list", "format a string"))
            for j, t in enumerate(DOCS)]
    eval_file.write_text("\n".join(json.dumps(r) for r in rows))
    task = TaskName.TEXT_RANKING
    summary = OptimizeJob(OptimizeConfig(model=str(tiny_model("bert", task)), task=task, output=tmp_path / "o",
                                         eval_file=eval_file,
                                         variants=("onnx-fp32", "onnx-int8-dynamic"))).run()
    fp32, int8 = summary.outcomes
    assert fp32.agreement.primary == "mean_kendall_tau" and fp32.agreement.value == pytest.approx(1.0)
    assert fp32.agreement.figures["top3_overlap"] == 1.0
    assert int8.agreement.figures["mean_kendall_tau"] <= 1.0 and "top1_agreement" in int8.agreement.figures
    assert {"ndcg@10", "mrr"} <= fp32.metric.keys() and 0 < fp32.metric["mrr"] <= 1
    predictor = kiln.load(tmp_path / "o")
    data = Rerank.read_eval(eval_file)
    assert len(data) == 3 and data.labels[0] == (1, 0, 0, 0, 0)
    assert Rerank.evaluate(predictor, data) == pytest.approx(fp32.metric)
