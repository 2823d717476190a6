"""BGE-M3 as one model with three outputs (hybrid-embedding) on a tiny random XLM-R in FlagEmbedding's layout: the
dense vector, the lexical weights and the ColBERT vectors of one forward, each equal to FlagEmbedding's own formula
computed here in PyTorch from the same files (FlagEmbedding itself: tests/e2e/test_hybrid_flagembedding.py), through
every engine kiln exports to, every route that serves them, and the gate of kiln optimize."""

from __future__ import annotations

import shutil

import numpy as np
import pytest
import torch
import transformers
from fastapi.testclient import TestClient

import kiln
from kiln.data.texts import builtin_sentences
from kiln.errors import UnsupportedModelError, UsageError
from kiln.serving.app import ServeConfig, create_app
from kiln.source.loading import load_source
from kiln.testing.factory import build_tiny_bge_m3

# Mixed lengths in one batch (padding exercised), a repeated word (one lexical weight per id: the largest), a text
# past the tiny model's 128 tokens (cut).
TEXTS = [*builtin_sentences()[:6], "the the the cat sat on the mat", " ".join(builtin_sentences()[10:40])]


@pytest.fixture(scope="module")
def bge_m3(tmp_path_factory):
    """A tiny BGE-M3 and its ONNX export."""
    model = build_tiny_bge_m3(tmp_path_factory.mktemp("bge-m3") / "model")
    return model, kiln.export(str(model), task="hybrid-embedding", output=model.parent / "export").artifact.path


def flagembedding_formula(model_dir, texts):
    """FlagEmbedding 1.4.2's M3 outputs (modeling.py's _dense/_sparse/_colbert_embedding and M3Embedder's
    post-processing), from the encoder and the two saved heads."""
    tokenizer = transformers.AutoTokenizer.from_pretrained(model_dir)
    encoder = transformers.AutoModel.from_pretrained(model_dir).eval()
    hidden = encoder.config.hidden_size
    sparse, colbert = torch.nn.Linear(hidden, 1), torch.nn.Linear(hidden, hidden)
    sparse.load_state_dict(torch.load(model_dir / "sparse_linear.pt", weights_only=True))
    colbert.load_state_dict(torch.load(model_dir / "colbert_linear.pt", weights_only=True))
    with torch.no_grad():
        batch = tokenizer(texts, padding=True, truncation=True, return_tensors="pt")
        states = encoder(**batch).last_hidden_state
        dense = torch.nn.functional.normalize(states[:, 0], dim=-1).numpy()
        weights = torch.relu(sparse(states)).squeeze(-1).numpy()
        vectors = colbert(states[:, 1:]) * batch["attention_mask"][:, 1:, None]
        vectors = torch.nn.functional.normalize(vectors, dim=-1).numpy()
    unused = {tokenizer.cls_token_id, tokenizer.eos_token_id, tokenizer.pad_token_id, tokenizer.unk_token_id}
    lexical = []
    for row, ids in zip(weights, batch["input_ids"].tolist()):
        found: dict[int, float] = {}
        for weight, token in zip(row, ids):
            if token not in unused and weight > 0 and weight > found.get(token, 0):
                found[token] = float(weight)
        lexical.append(found)
    counts = batch["attention_mask"].sum(1).tolist()
    return dense, lexical, [v[: n - 1] for v, n in zip(vectors, counts)]


def _assert_equal(results, expected, atol=2e-5):
    dense, lexical, multi = expected
    for i, got in enumerate(results):
        np.testing.assert_allclose(got.dense, dense[i], atol=atol)
        assert dict(zip(got.sparse.indices, got.sparse.values)) == pytest.approx(lexical[i], abs=atol)
        assert got.multi.shape == multi[i].shape
        np.testing.assert_allclose(got.multi, multi[i], atol=atol)


@pytest.mark.parametrize("format", ["onnx", "torchscript"])
def test_each_output_equals_flagembeddings_formula(bge_m3, tmp_path, format):
    model_dir, art = bge_m3
    expected = flagembedding_formula(model_dir, TEXTS)
    if format != "onnx":
        art = kiln.export(str(model_dir), task="hybrid-embedding", format=format, output=tmp_path / "art").artifact.path
    ours = kiln.load(art)
    results = ours.predict(TEXTS, output="all")
    _assert_equal(results, expected)
    repeated = results[6]
    assert len(repeated.sparse.indices) < len(repeated.multi)  # "the" weighs once, at its largest
    # the outputs one at a time are the same as together, and the dense one is what encode() gives
    np.testing.assert_allclose(ours.encode(TEXTS), expected[0], atol=2e-5)
    assert ours.predict(TEXTS, output="sparse") == [r.sparse for r in results]
    for alone, together in zip(ours.predict(TEXTS, output="multi"), results):
        np.testing.assert_array_equal(alone, together.multi)


def test_the_pytorch_reference_is_the_formula_too(bge_m3):
    """What every variant is judged against (the original in PyTorch) is FlagEmbedding's formula itself."""
    model_dir, _ = bge_m3
    source = load_source(str(model_dir), "hybrid-embedding")
    assert source.task_config.special_ids == (0, 1, 2, 3)  # XLM-R's <s>, <pad>, </s>, <unk>; not <mask>
    assert source.task_config.late_interaction == {"dimension": 32}
    from kiln.source.reference import reference_predictor

    _assert_equal(reference_predictor(source).predict(TEXTS, output="all"), flagembedding_formula(model_dir, TEXTS))


def test_kiln_audits_reference_is_the_dense_vector(bge_m3):
    """kiln audit judges a served BGE-M3's /embed against the encoder's CLS state, as the model's own vector."""
    from kiln.auditing.reference import Reference

    reference = Reference(load_source(str(bge_m3[0]), "hybrid-embedding"))
    np.testing.assert_allclose(reference.vectors(TEXTS, reference.configured),
                               flagembedding_formula(bge_m3[0], TEXTS)[0], atol=2e-5)


def test_sparse_options_and_refusals(bge_m3):
    ours = kiln.load(bge_m3[1])
    full = ours.predict(TEXTS[:3], output="sparse")
    top = ours.predict(TEXTS[:3], output="sparse", top_k=2)
    for a, b in zip(full, top):
        heaviest = sorted(zip(a.values, a.indices), reverse=True)[:2]
        assert sorted(b.indices) == list(b.indices) and set(b.indices) == {i for _, i in heaviest}
    above = ours.predict(TEXTS[:3], output="sparse", threshold=0.5)
    assert all(v > 0.5 for r in above for v in r.values)
    with pytest.raises(UsageError, match=r"dimensions: applies to the dense vector; output 'multi' returns ColBERT"):
        ours.predict(TEXTS[:1], output="multi", dimensions=8)
    with pytest.raises(UsageError, match=r"threshold and top_k choose lexical weights; output 'dense' has none"):
        ours.predict(TEXTS[:1], top_k=3)
    with pytest.raises(UsageError, match=r"output must be one of dense, sparse, multi, all \(got 'colbert'\)"):
        ours.predict(TEXTS[:1], output="colbert")
    with pytest.raises(UsageError, match=r"tokens: a hybrid model's per-token vectors are its ColBERT vectors"):
        ours.predict(TEXTS[:1], tokens=True)


def test_a_directory_without_the_heads_is_refused_naming_them(bge_m3, tmp_path):
    model = tmp_path / "model"
    shutil.copytree(bge_m3[0], model)
    (model / "colbert_linear.pt").unlink()
    with pytest.raises(UnsupportedModelError, match=r"not in BGE-M3's layout: colbert_linear.pt missing .* for its "
                                                    r"dense vectors alone use feature-extraction"):
        load_source(str(model), "hybrid-embedding")
    assert load_source(str(model), "feature-extraction").task_config.pooling.value == "cls"  # dense alone: fine


def test_the_pytorch_variants_carry_the_heads(bge_m3, tmp_path):
    """torch-fp16 saves the encoder as transformers does and both heads beside it (kiln.model.module.
    save_task_module), so kiln optimize judges it like any variant and the chosen one answers FlagEmbedding's
    formula; a damaged side file is one error naming it."""
    from kiln.errors import ArtifactError
    from kiln.model.module import SIDE_MODULES_FILE, load_task_module
    from kiln.optimizing.job import OptimizeConfig, OptimizeJob

    model_dir, _ = bge_m3
    summary = OptimizeJob(OptimizeConfig(model=str(model_dir), task="hybrid-embedding", output=tmp_path / "o",
                                         variants=("torch-fp16",))).run()
    (fp16,) = summary.outcomes
    assert fp16.status == "accepted" and summary.best == "torch-fp16", fp16.reason
    _assert_equal(kiln.load(tmp_path / "o" / "best").predict(TEXTS, output="all"),
                  flagembedding_formula(model_dir, TEXTS), atol=2e-2)  # fp16 arithmetic, fp32 formula
    saved = tmp_path / "o" / "best" / "torch"
    side = saved / SIDE_MODULES_FILE
    assert side.is_file() and type(load_task_module(saved).model).__name__ == "HybridModel"
    side.write_bytes(side.read_bytes()[:64])
    with pytest.raises(ArtifactError, match=f"cannot load the PyTorch variant in {saved}: {SIDE_MODULES_FILE} "
                                            "cannot be read"):
        load_task_module(saved)


def test_a_damaged_head_file_is_one_error_naming_it(bge_m3, tmp_path):
    """A truncated head (an interrupted download) and one of the wrong width each fail loading with the file's name,
    not inside torch's unpickler or at the first forward."""
    from kiln.errors import ModelLoadError

    model = tmp_path / "model"
    shutil.copytree(bge_m3[0], model)
    head = model / "sparse_linear.pt"
    head.write_bytes(head.read_bytes()[:100])
    with pytest.raises(ModelLoadError, match=r"could not read .*sparse_linear.pt as a state dict of tensors"):
        load_source(str(model), "hybrid-embedding")
    torch.save(torch.nn.Linear(8, 1).state_dict(), head)
    with pytest.raises(ModelLoadError, match=r"sparse_linear.pt must hold a Linear's weight \[out, 32\]"):
        load_source(str(model), "hybrid-embedding")


def test_every_route_serves_what_the_artifact_computes(bge_m3):
    ours = kiln.load(bge_m3[1])
    offline = ours.predict(TEXTS, output="all")
    with TestClient(create_app(ServeConfig(models={"m3": bge_m3[1]}))) as client:
        dense = client.post("/kiln/embed", json={"inputs": TEXTS}).json()["embeddings"]
        np.testing.assert_allclose(dense, [r.dense for r in offline], atol=1e-6)
        openai = client.post("/v1/embeddings", json={"input": TEXTS, "model": "BAAI/bge-m3"}).json()["data"]
        np.testing.assert_allclose([d["embedding"] for d in openai], [r.dense for r in offline], atol=1e-6)
        sparse = client.post("/kiln/embed_sparse", json={"inputs": TEXTS}).json()["embeddings"]
        assert [{t["index"]: t["value"] for t in terms} for terms in sparse] == \
            [pytest.approx(dict(zip(r.sparse.indices, r.sparse.values)), abs=1e-6) for r in offline]
        multi = client.post("/embed_multi", json={"inputs": TEXTS}).json()
        for got, want in zip(multi["embeddings"], offline):
            np.testing.assert_allclose(got, want.multi, atol=1e-6)
        assert multi["truncated"] is True  # the last text is past 128 tokens
        hybrid = client.post("/embed_hybrid", json={"inputs": TEXTS[:2], "top_k": 2}).json()["embeddings"]
        assert [len(h["sparse"]) for h in hybrid] == [2, 2]
        np.testing.assert_allclose(hybrid[1]["multi"], offline[1].multi, atol=1e-6)
        refused = client.post("/embed_multi", json={"inputs": TEXTS[:1], "dimensions": 8})
        assert refused.status_code == 422 and "dimensions" in refused.text
        v2 = client.post("/v2/models/m3/infer", json={"inputs": [
            {"name": "TEXT", "shape": [2, 1], "datatype": "BYTES", "data": TEXTS[:2]}]}).json()["outputs"]
        assert [o["name"] for o in v2] == ["EMBEDDING"]  # KServe v2 (and kiln triton): the dense vector
        np.testing.assert_allclose(np.reshape(v2[0]["data"], (2, -1)), [r.dense for r in offline[:2]], atol=1e-6)
    with TestClient(create_app(ServeConfig(models={"m3": bge_m3[1]}, protocols=("tei",)))) as client:
        tei_dense = client.post("/embed", json={"inputs": TEXTS[:6]}).json()
        np.testing.assert_allclose(tei_dense, [r.dense for r in offline[:6]], atol=1e-6)
        tei_sparse = client.post("/embed_sparse", json={"inputs": TEXTS[:6]}).json()
        assert [{t["index"]: t["value"] for t in terms} for terms in tei_sparse] == \
            [pytest.approx(dict(zip(r.sparse.indices, r.sparse.values)), abs=1e-6) for r in offline[:6]]


def test_retrieval_rows_give_the_table_of_each_output_and_their_combination(bge_m3, tmp_path):
    """--eval rows of (query, text, relevance): NDCG@10 of dense, sparse, multi and their mean, each query searching
    every text; the dense one equals ranking by encode()'s cosine."""
    import json

    from kiln.scoring import ndcg_at_k
    from kiln.tasks.hybrid_embedding.validation import HybridEmbeddingValidation

    rows = [{"query": q, "text": t, "relevance": r} for q, t, r in [
        (TEXTS[0], TEXTS[1], 2), (TEXTS[0], TEXTS[2], 0), (TEXTS[0], TEXTS[3], 1),
        (TEXTS[4], TEXTS[5], 1), (TEXTS[4], TEXTS[6], 0), (TEXTS[4], TEXTS[1], 0)]]
    path = tmp_path / "eval.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows))
    ours = kiln.load(bge_m3[1])
    figures = HybridEmbeddingValidation.evaluate(ours, HybridEmbeddingValidation.read_eval(path))
    modes = ("dense", "sparse", "multi", "dense+sparse+multi")
    assert {f"ndcg@10_{m}" for m in modes} | {"spearman", "spearman_sparse"} <= set(figures)
    assert all(0 <= figures[f"ndcg@10_{m}"] <= 1 for m in modes)
    documents = [TEXTS[i] for i in (1, 2, 3, 5, 6)]
    relevance = {TEXTS[0]: [2, 0, 1, 0, 0], TEXTS[4]: [0, 0, 0, 1, 0]}
    by_hand = [ndcg_at_k(ours.encode(documents) @ ours.encode([q])[0], rel) for q, rel in relevance.items()]
    assert figures["ndcg@10_dense"] == pytest.approx(np.mean(by_hand))
