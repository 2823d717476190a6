"""Retrieval workloads (issue 13): Matryoshka sizes, rerankers, sparse embeddings, long documents."""

from __future__ import annotations

import json
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
from fastapi.testclient import TestClient

import kiln
from kiln.artifact.directory import Artifact
from kiln.data.texts import builtin_sentences
from kiln.errors import UsageError
from kiln.optimizing.job import OptimizeConfig, OptimizeJob
from kiln.scoring import kendall_tau, ndcg_at_k, reciprocal_rank
from kiln.serving.app import ServeConfig, create_app
from kiln.serving.batcher import BatchLimits
from kiln.tasks import TaskName
from kiln.tasks.rerank.task import Rerank


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
    with pytest.raises(UsageError, match=r"matryoshka_dims must be at most the embedding size 32 .* \(got 64\)"):
        OptimizeJob(OptimizeConfig(model=str(tiny_model("bert")), task=TaskName.FEATURE_EXTRACTION,
                                   output=tmp_path / "o", variants=("onnx-fp32",), matryoshka_dims=(64,))).run()
    with pytest.raises(UsageError, match="matryoshka_dims applies to embedding tasks"):
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


class Slow:
    """An engine whose every call takes ``seconds`` longer."""

    def __init__(self, engine, seconds: float) -> None:
        self.engine, self.seconds = engine, seconds

    def __getattr__(self, name):
        return getattr(self.engine, name)

    def run(self, inputs):
        time.sleep(self.seconds)
        return self.engine.run(inputs)


def test_rerank_route_answers_like_offline_and_batches_pairs_across_requests(task_artifacts):
    art = task_artifacts[TaskName.TEXT_RANKING]
    offline = kiln.load(art).rerank(QUERY, DOCS)
    # One session, each call 50 ms longer: the concurrent requests queue while a batch runs, whatever the machine's
    # speed (with a free session per request and a fast engine, each could run alone).
    config = ServeConfig(models={"ranker": art}, max_inputs_per_request=8, sessions=1,
                         limits=BatchLimits(max_batch_tokens=4096, max_batch_size=64, max_delay_s=0.05))
    app = create_app(config)
    with TestClient(app) as c:
        predictor = app.state.models["ranker"].predictor
        predictor.engine = Slow(predictor.engine, 0.05)
        body = c.post("/kiln/rerank", json={"query": QUERY, "texts": DOCS, "return_documents": True}).json()
        top = c.post("/kiln/rerank", json={"query": QUERY, "texts": DOCS, "top_n": 1}).json()
        with ThreadPoolExecutor(8) as pool:
            together = list(pool.map(lambda _: c.post("/kiln/rerank", json={"query": QUERY, "texts": DOCS}).json(),
                                     range(8)))
        metrics = c.get("/metrics").text
        errors = {name: c.post("/kiln/rerank", json=payload) for name, payload in {
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
    data = Rerank.validation.read_eval(eval_file)
    assert len(data) == 3 and data.labels[0] == (1, 0, 0, 0, 0)
    assert Rerank.validation.evaluate(predictor, data) == pytest.approx(fp32.metric)


# -- sparse embeddings ---------------------------------------------------------------------------------------------
def _torch_splade(model_dir, texts: list[str]) -> np.ndarray:
    """SPLADE from transformers directly: max over tokens of log(1 + relu(logits)), padding masked, specials 0."""
    import torch
    import transformers

    tokenizer = transformers.AutoTokenizer.from_pretrained(model_dir)
    model = transformers.AutoModelForMaskedLM.from_pretrained(model_dir).eval()
    with torch.no_grad():
        batch = tokenizer(texts, padding=True, truncation=True, return_tensors="pt")
        logits = model(**batch).logits
        weights = torch.log1p(torch.relu(logits)) * batch["attention_mask"].unsqueeze(-1)
        out = weights.amax(dim=1).numpy()
    out[:, tokenizer.all_special_ids] = 0
    return out


def test_sparse_embeddings_match_splade_computed_by_hand(tiny_model, task_artifacts):
    texts = ["hello world", DOCS[0], " ".join(DOCS)]
    want = _torch_splade(tiny_model("bert", TaskName.SPARSE_EMBEDDING), texts)
    predictor = kiln.load(task_artifacts[TaskName.SPARSE_EMBEDDING])
    got = predictor.predict(texts)
    size = predictor.config.dimension
    assert size == want.shape[1]
    np.testing.assert_allclose(np.stack([v.dense(size) for v in got]), want, atol=1e-4)
    assert all(list(v.indices) == sorted(v.indices) and min(v.values) > 0 for v in got)
    assert not set(predictor.config.special_ids) & {i for v in got for i in v.indices}
    top = predictor.predict(texts[:1], top_k=3, threshold=0.0)[0]
    assert len(top.indices) == 3 and set(top.indices) == set(np.argsort(-want[0])[:3])


def test_embed_sparse_route(task_artifacts):
    art = task_artifacts[TaskName.SPARSE_EMBEDDING]
    offline = kiln.load(art).predict(["hello world", DOCS[1]], threshold=0.5)
    with TestClient(create_app(ServeConfig(models={"splade": art}))) as c:
        body = c.post("/kiln/embed_sparse", json={"inputs": ["hello world", DOCS[1]], "threshold": 0.5}).json()
        top = c.post("/kiln/embed_sparse", json={"inputs": "hello world", "top_k": 2}).json()
        bad = {k: c.post("/kiln/embed_sparse", json={"inputs": "x", **v}).status_code
               for k, v in {"top_k": {"top_k": 0}, "threshold": {"threshold": -1}, "dims": {"dimensions": 8}}.items()}
    for terms, want in zip(body["embeddings"], offline):
        assert [t["index"] for t in terms] == list(want.indices)
        np.testing.assert_allclose([t["value"] for t in terms], want.values, atol=1e-5)
    assert len(top["embeddings"][0]) == 2 and body["truncated"] == [False, False]
    assert bad == {"top_k": 422, "threshold": 422, "dims": 422}


def test_optimize_sparse_reports_cosine_and_term_overlap(tiny_model, tmp_path):
    task = TaskName.SPARSE_EMBEDDING
    summary = OptimizeJob(OptimizeConfig(model=str(tiny_model("bert", task)), task=task, output=tmp_path / "o",
                                         variants=("onnx-fp32", "onnx-int8-dynamic"))).run()
    fp32, int8 = summary.outcomes
    assert fp32.agreement.figures["min_cosine"] == pytest.approx(1.0, abs=1e-5)
    assert fp32.agreement.figures["top10_term_overlap"] == pytest.approx(1.0)
    assert 0 < int8.agreement.figures["mean_cosine"] <= 1 + 1e-6 and "mean_terms_variant" in int8.agreement.figures
    assert "spearman" in fp32.metric  # the built-in STS pairs, scored by sparse dot products


# -- long documents ------------------------------------------------------------------------------------------------
LONG = " ".join(builtin_sentences()[:30])


def test_windows_are_cut_on_token_offsets_and_nothing_is_lost_or_repeated_beyond_the_overlap(task_artifacts,
                                                                                              tiny_model):
    import torch
    import transformers

    predictor = kiln.load(task_artifacts[TaskName.FEATURE_EXTRACTION])
    full = predictor.encoder.encode([LONG], truncate=False)[0]
    text_ids = [i for i, special in zip(full.ids, full.special_tokens_mask) if not special]
    size, overlap = 40, 8
    prepared = predictor.prepare([LONG], predictor.handler.options(chunking={"size": size, "overlap": overlap}))
    windows = [[i for i, sp in zip(e.ids, e.special_tokens_mask) if not sp] for e in prepared.encodings]
    assert len(text_ids) > 3 * size and len(windows) == -(-(len(text_ids) - overlap) // (size - overlap))
    step = size - overlap
    for k, ids in enumerate(windows):  # window k is exactly text tokens [k*step, k*step + size)
        assert ids == text_ids[k * step : k * step + size]
    rebuilt = windows[0] + [i for w in windows[1:] for i in w[overlap:]]
    assert rebuilt == text_ids  # every token once, beyond the overlap

    result = predictor.predict([LONG], chunking=kiln.Chunking(size, overlap, "windows"))[0]
    starts = [w.start for w in result.windows]
    assert starts[0] == 0 and result.windows[-1].end == len(LONG) and starts == sorted(starts)
    assert all(LONG[w.start : w.end].strip() == LONG[w.start : w.end] for w in result.windows)
    # Each window's embedding is the model's on [CLS] + that window's tokens + [SEP].
    model = transformers.AutoModel.from_pretrained(tiny_model("bert")).eval()
    cls, sep = full.ids[0], full.ids[-1]
    with torch.no_grad():
        for ids, window in zip(windows, result.windows):
            hidden = model(input_ids=torch.tensor([[cls, *ids, sep]])).last_hidden_state[0]
            np.testing.assert_allclose(window.embedding, hidden.mean(0).numpy(), atol=1e-4)
    mean = predictor.predict([LONG], chunking={"size": size, "overlap": overlap})[0]
    np.testing.assert_allclose(mean, np.mean([w.embedding for w in result.windows], axis=0), atol=1e-6)
    np.testing.assert_allclose(result.embedding, mean, atol=1e-6)
    short = predictor.predict(["hello world"], chunking={"size": size, "overlap": overlap})[0]
    np.testing.assert_allclose(short, predictor.predict(["hello world"])[0], atol=1e-6)  # one window: no change


def test_chunking_over_http_and_its_errors(task_artifacts):
    models = {"emb": task_artifacts[TaskName.FEATURE_EXTRACTION], "cls": task_artifacts[TaskName.TEXT_CLASSIFICATION]}
    classifier = kiln.load(models["cls"])
    logits = classifier.run_features(classifier.prepare([LONG], classifier.handler.options(
        chunking={"size": 30, "overlap": 5})).encodings)
    with TestClient(create_app(ServeConfig(models=models))) as c:
        windows = c.post("/kiln/embed", json={"inputs": [LONG, "short text"], "truncate": False,
                                         "chunking": {"size": 30, "overlap": 5, "mode": "windows"}}).json()
        labels = {mode: c.post("/classify", json={"inputs": LONG, "model": "cls", "top_k": None,
                                                  "chunking": {"size": 30, "overlap": 5, "mode": mode}}).json()
                  for mode in ("max", "mean")}
        errors = {name: c.post(path, json=body) for name, (path, body) in {
            "overlap": ("/kiln/embed", {"inputs": LONG, "chunking": {"size": 30, "overlap": 30}}),
            "size": ("/kiln/embed", {"inputs": LONG, "chunking": {"size": 1000}}),
            "mode": ("/kiln/embed", {"inputs": LONG, "chunking": {"size": 30, "mode": "max"}}),
            "pair": ("/classify", {"inputs": {"text": "a", "text_pair": "b"}, "model": "cls",
                                   "chunking": {"size": 30}})}.items()}
    assert len(windows["chunks"][0]) > 3 and len(windows["chunks"][1]) == 1
    assert windows["truncated"] == [False, False] and len(windows["embeddings"]) == 2
    np.testing.assert_allclose(windows["embeddings"][0], np.mean([w["embedding"] for w in windows["chunks"][0]], 0),
                               atol=1e-5)
    for mode, combine in (("max", np.max), ("mean", np.mean)):
        probabilities = np.exp(combine(np.stack(logits), 0))
        probabilities /= probabilities.sum()
        got = {r["label"]: r["score"] for r in labels[mode]["results"][0]}
        np.testing.assert_allclose([got[name] for name in ("negative", "neutral", "positive")], probabilities,
                                   atol=1e-5)
    assert {k: r.status_code for k, r in errors.items()} == dict.fromkeys(errors, 422)
    assert "chunking overlap must be at least 0 and less than size 30 (got 30)" in errors["overlap"].text
    assert "chunking size must be at most 126" in errors["size"].text
    assert "chunking.mode" in errors["mode"].text
    assert "chunking splits single texts" in errors["pair"].text
