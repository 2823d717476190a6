"""Decoder-based embedders and rerankers (Qwen3-Embedding, Qwen3-Reranker) on a tiny random Qwen3: a causal encoder
pooled at each text's real last token however the tokenizer pads, its instruction prompts, and a language model
scored by its "yes" logit minus its "no" logit after its prompt template. Each is checked equal to what
sentence-transformers computes on the same directory (its SentenceTransformer and its CrossEncoder's LogitScore),
and the reranker to the model card's formula in PyTorch."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import torch
import transformers
from fastapi.testclient import TestClient

import kiln
from kiln.data.texts import builtin_sentences
from kiln.errors import UnsupportedModelError
from kiln.serving.app import ServeConfig, create_app
from kiln.source.loading import load_source
from kiln.tasks import TaskName
from kiln.testing.factory import build_tiny_causal_reranker, write_sentence_transformers_files

# Qwen3-Embedding's own prompts (config_sentence_transformers.json): an instruction for queries, none for documents.
PROMPTS = {"query": "Instruct: Given a web search query, retrieve relevant passages that answer the query\nQuery:",
           "document": ""}
TEXTS = list(builtin_sentences()[:8])


@pytest.fixture(scope="module")
def embedder(tiny_model, tmp_path_factory):
    """A tiny Qwen3-Embedding (last-token pooling, normalized, its prompts) and its ONNX export."""
    model = tmp_path_factory.mktemp("qwen3-embedding") / "model"
    shutil.copytree(tiny_model("qwen3"), model)
    write_sentence_transformers_files(model, pooling="lasttoken", prompts=PROMPTS)
    return model, kiln.export(str(model), task="feature-extraction", output=model.parent / "export").artifact.path


@pytest.mark.parametrize("side", ["left", "right"])
def test_a_causal_embedder_pools_the_real_last_token_as_sentence_transformers_does(embedder, tmp_path, side):
    """Qwen3-Embedding's tokenizer pads on the left; kiln pads on the right and reads each row's last real token:
    the same vectors either way (rotary positions see only relative distances)."""
    from sentence_transformers import SentenceTransformer

    model = tmp_path / side
    shutil.copytree(embedder[0], model)
    config = json.loads((model / "tokenizer_config.json").read_text())
    (model / "tokenizer_config.json").write_text(json.dumps({**config, "padding_side": side}))
    theirs = SentenceTransformer(str(model), device="cpu")
    assert theirs.tokenizer.padding_side == side
    ours = kiln.load(embedder[1])
    for name in ("query", None):
        np.testing.assert_allclose(ours.encode(TEXTS, prompt_name=name), theirs.encode(TEXTS, prompt_name=name),
                                   atol=2e-5)
    np.testing.assert_allclose(ours.encode(TEXTS, prompt_name="query", truncate_dim=16),
                               theirs.encode(TEXTS, prompt_name="query", truncate_dim=16), atol=2e-5)
    np.testing.assert_allclose(ours.encode_query(TEXTS), theirs.encode_query(TEXTS), atol=2e-5)  # model cards' way
    np.testing.assert_allclose(ours.encode_document(TEXTS), theirs.encode_document(TEXTS), atol=2e-5)
    # the instruction matters: a query's vector is not its text's
    assert not np.allclose(ours.encode(TEXTS[:1], prompt_name="query"), ours.encode(TEXTS[:1]), atol=1e-3)


@pytest.fixture(scope="module")
def reranker(tmp_path_factory):
    """A tiny Qwen3-Reranker and its ONNX export."""
    model = build_tiny_causal_reranker(tmp_path_factory.mktemp("qwen3-reranker") / "model")
    return model, kiln.export(str(model), task="text-ranking", output=model.parent / "export").artifact.path


PAIRS = [(TEXTS[0], text) for text in TEXTS[1:]] + [("a short query", " ".join(builtin_sentences()[10:60]))]


def _card_scores(model, pairs):
    """Qwen3-Reranker's model card: the prompt, the last position's logits, softmax over [no, yes], yes."""
    tokenizer = transformers.AutoTokenizer.from_pretrained(model)
    lm = transformers.AutoModelForCausalLM.from_pretrained(model).eval()
    yes, no = tokenizer.convert_tokens_to_ids("yes"), tokenizer.convert_tokens_to_ids("no")
    scores = []
    for query, document in pairs:
        text = tokenizer.apply_chat_template([{"role": "query", "content": query},
                                              {"role": "document", "content": document}], tokenize=False)
        with torch.no_grad():
            logits = lm(**tokenizer(text, add_special_tokens=False, return_tensors="pt")).logits[0, -1]
        scores.append(torch.log_softmax(torch.stack([logits[no], logits[yes]]), 0)[1].exp().item())
    return np.array(scores)


def _scores(predictor, pairs, **options):
    return np.array([r[0].score for r in predictor.predict([{"query": q, "texts": [d]} for q, d in pairs],
                                                           **options)])


def test_a_causal_reranker_scores_as_cross_encoder_and_its_model_card_do(reranker):
    from sentence_transformers import CrossEncoder

    model, artifact = reranker
    ours = kiln.load(artifact)
    source = load_source(str(model), TaskName.TEXT_RANKING)
    prompt = source.task_config.pair_prompt
    assert prompt.suffix.endswith("<think>\n\n</think>\n\n") and "<Query>: " in prompt.prefix
    # the last pair is longer than the model's 512 tokens: cut, with the template's closing tokens restored
    features = ours.handler.prepare([kiln.RerankQuery(q, (d,)) for q, d in PAIRS], ours.encoder,
                                    ours.handler.options()).encodings
    assert [f.truncated for f in features] == [False] * (len(PAIRS) - 1) + [True]
    assert tuple(features[-1].ids[-len(prompt.suffix_ids):]) == prompt.suffix_ids
    assert len(features[-1].ids) == source.task_config.max_length
    theirs = CrossEncoder(str(model), device="cpu")
    np.testing.assert_allclose(_scores(ours, PAIRS, raw_scores=True),
                               theirs.predict(PAIRS, activation_fn=torch.nn.Identity()), atol=2e-5)
    np.testing.assert_allclose(_scores(ours, PAIRS[:-1]), _card_scores(model, PAIRS[:-1]), atol=2e-6)
    assert np.ptp(_scores(ours, PAIRS)) > 1e-3  # the documents are told apart


def test_a_causal_reranker_is_served_at_kilns_and_teis_rerank(reranker):
    query, texts = PAIRS[0][0], [d for _, d in PAIRS[:4]]
    offline = kiln.load(reranker[1]).rerank(query, texts)
    with TestClient(create_app(ServeConfig(models={"r": reranker[1]}))) as client:
        got = client.post("/kiln/rerank", json={"query": query, "texts": texts})
    assert got.status_code == 200, got.text
    assert [r["index"] for r in got.json()["results"]] == [r.index for r in offline]
    np.testing.assert_allclose([r["score"] for r in got.json()["results"]], [r.score for r in offline], atol=1e-5)
    with TestClient(create_app(ServeConfig(models={"r": reranker[1]}, protocols=("tei",)))) as client:
        got = client.post("/rerank", json={"query": query, "texts": texts})
        left = client.post("/rerank", json={"query": query, "texts": texts, "truncation_direction": "Left"})
    assert got.status_code == 200, got.text
    np.testing.assert_allclose([r["score"] for r in got.json()], [r.score for r in offline], atol=1e-5)
    # its pair is a prompt template read at its closing tokens: cutting its start would drop the instruction
    assert left.status_code == 422 and "truncation_side left: a causal reranker" in left.json()["error"]


def test_transformers_pipelines_are_refused_a_causal_reranker(reranker):
    """A pipeline would tokenize bare (query, text) pairs without the prompt template: scores silently wrong."""
    from kiln.errors import UsageError

    with pytest.raises(UsageError, match="causal reranker: it reads each pair through its prompt template"):
        kiln.hf_model(reranker[1])


def test_a_language_model_without_a_pair_template_is_refused_with_the_fix(reranker, tmp_path):
    model = tmp_path / "plain"
    shutil.copytree(reranker[0], model)
    (model / "chat_template.jinja").unlink()
    with pytest.raises(UnsupportedModelError, match="no chat template.*'query' and 'document' roles"):
        load_source(str(model), TaskName.TEXT_RANKING)
    (model / "chat_template.jinja").write_text(  # a chat model's template: it renders user/assistant turns only
        "{% for m in messages %}{% if m.role == 'user' %}<|im_start|>user\n{{ m.content }}<|im_end|>\n"
        "{% endif %}{% endfor %}<|im_start|>assistant\n")
    with pytest.raises(UnsupportedModelError, match="does not place the 'query' content once"):
        load_source(str(model), TaskName.TEXT_RANKING)
    (model / "chat_template.jinja").write_text(
        "{% for m in messages %}<{{ m.role }}>{{ m.content | replace('.', '!') }}{% endfor %}")
    with pytest.raises(UnsupportedModelError, match="changes the text it is given"):
        load_source(str(model), TaskName.TEXT_RANKING)


def test_cohere_rerank_routes_score_as_kilns_rerank(reranker):
    """Cohere's /v1/rerank and /v2/rerank bodies, strings or {"text"} documents, answered in Cohere's shape with
    kiln's own scores; what kiln does not do is a 422 in Cohere's error shape, naming the field."""
    query, texts = PAIRS[0][0], [d for _, d in PAIRS[:4]]
    offline = kiln.load(reranker[1]).rerank(query, texts)
    with TestClient(create_app(ServeConfig(models={"r": reranker[1]}))) as client:
        for version, documents in (("v1", [{"text": t} for t in texts]), ("v2", texts)):
            got = client.post(f"/{version}/rerank", json={"model": "Qwen/Qwen3-Reranker-0.6B", "query": query,
                                                          "documents": documents, "top_n": 3,
                                                          "return_documents": True})
            assert got.status_code == 200, got.text
            body = got.json()
            assert body["meta"]["api_version"]["version"] == version[1:] and body["id"]
            assert [(r["index"], r["document"]["text"]) for r in body["results"]] == \
                [(r.index, texts[r.index]) for r in offline[:3]]
            np.testing.assert_allclose([r["relevance_score"] for r in body["results"]],
                                       [r.score for r in offline[:3]], atol=1e-5)
        refused = client.post("/v2/rerank", json={"model": "m", "query": query, "documents": texts,
                                                  "max_chunks_per_doc": 2})
        assert refused.status_code == 422 and "max_chunks_per_doc" in refused.json()["message"]
        # max_tokens_per_doc: each document cut to its first 3 tokens (the tokenizer's own offsets, in the test)
        cut = client.post("/v2/rerank", json={"model": "m", "query": query, "documents": texts,
                                              "max_tokens_per_doc": 3, "return_documents": True})
        assert cut.status_code == 200, cut.text
        tokenizer = transformers.AutoTokenizer.from_pretrained(reranker[0])
        ends = [tokenizer(t, add_special_tokens=False, return_offsets_mapping=True)["offset_mapping"][2][1]
                for t in texts]
        want = kiln.load(reranker[1]).rerank(query, [t[:end] for t, end in zip(texts, ends)])
        assert [r["index"] for r in cut.json()["results"]] == [r.index for r in want]
        np.testing.assert_allclose([r["relevance_score"] for r in cut.json()["results"]], [r.score for r in want],
                                   atol=1e-5)
        assert [r["document"]["text"] for r in cut.json()["results"]] == [texts[r.index] for r in want]
        assert not np.allclose(sorted(r.score for r in want), sorted(r.score for r in offline), atol=1e-4)
        assert {"/v1/rerank", "/v2/rerank"} <= set(client.get("/openapi.json").json()["paths"])
