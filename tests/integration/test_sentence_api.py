"""Retrieval code written for sentence-transformers runs on ``kiln.load(...)`` with the load line changed: the same
calls on ``SentenceTransformer(dir)`` and on kiln's artifact of that directory give the same answers, prompts and
similarity functions included."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import torch

import kiln
from kiln.data.texts import builtin_sentences
from kiln.errors import UsageError
from kiln.testing.factory import write_sentence_transformers_files

# "passage": encode_document's second choice, after sentence-transformers 6's empty "document"
PROMPTS = {"query": "search_query: ", "passage": "search_document: "}
QUERIES = ["how do I read a file", "what is a list"]
DOCUMENTS = list(builtin_sentences()[:5])


@pytest.fixture(scope="module")
def pair(tiny_model, tmp_path_factory):
    from sentence_transformers import SentenceTransformer

    model = tmp_path_factory.mktemp("st-api") / "model"
    shutil.copytree(tiny_model("nomic_bert"), model)
    write_sentence_transformers_files(model, prompts=PROMPTS, normalize=False)
    artifact = kiln.export(str(model), task="feature-extraction", output=model.parent / "export").artifact.path
    return model, SentenceTransformer(str(model), device="cpu"), kiln.load(artifact)


def test_the_retrieval_calls_answer_as_sentence_transformers_does(pair):
    _, theirs, ours = pair
    for call in ("encode_query", "encode_document"):
        for kwargs in ({}, {"prompt_name": "query"}, {"prompt": "x: "}, {"truncate_dim": 8}):
            np.testing.assert_allclose(getattr(ours, call)(DOCUMENTS, **kwargs),
                                       getattr(theirs, call)(DOCUMENTS, **kwargs), atol=2e-5)
    assert not np.allclose(ours.encode_query(DOCUMENTS), ours.encode_document(DOCUMENTS), atol=1e-3)
    np.testing.assert_allclose(ours.encode_document(DOCUMENTS), ours.encode(DOCUMENTS), atol=1e-6)
    queries, documents = ours.encode_query(QUERIES), ours.encode_document(DOCUMENTS)
    got, want = ours.similarity(queries, documents), theirs.similarity(queries, documents)
    assert isinstance(got, torch.Tensor) and got.shape == (2, 5)
    torch.testing.assert_close(got, want, atol=2e-5, rtol=0)
    torch.testing.assert_close(ours.similarity_pairwise(documents[:2], queries),
                               theirs.similarity_pairwise(documents[:2], queries), atol=2e-5, rtol=0)
    assert ours.similarity_fn_name == theirs.similarity_fn_name == "cosine"
    assert ours.get_sentence_embedding_dimension() == theirs.get_embedding_dimension() == 32
    assert ours.max_seq_length == theirs.max_seq_length
    assert ours.prompts == theirs.prompts == {"document": "", **PROMPTS}  # sentence-transformers 6's empty default
    assert ours.default_prompt_name is theirs.default_prompt_name
    assert ours.tokenizer.encode("hello world").ids == theirs.tokenizer("hello world")["input_ids"]


@pytest.mark.parametrize("name", ["dot", "euclidean", "manhattan"])
def test_the_models_similarity_function_is_the_one_used(pair, tmp_path, name):
    from sentence_transformers import SentenceTransformer

    model = tmp_path / "model"
    shutil.copytree(pair[0], model)
    config = json.loads((model / "config_sentence_transformers.json").read_text())
    (model / "config_sentence_transformers.json").write_text(json.dumps({**config, "similarity_fn_name": name}))
    theirs = SentenceTransformer(str(model), device="cpu")
    ours = kiln.load(kiln.export(str(model), task="feature-extraction", output=tmp_path / "out").artifact.path)
    assert ours.similarity_fn_name == name
    a, b = ours.encode(QUERIES), ours.encode(DOCUMENTS)
    torch.testing.assert_close(ours.similarity(a, b), theirs.similarity(a, b), atol=1e-4, rtol=1e-5)
    torch.testing.assert_close(ours.similarity_pairwise(a, b[:2]), theirs.similarity_pairwise(a, b[:2]), atol=1e-4,
                               rtol=1e-5)


def test_token_embeddings_are_sentence_transformers_own(pair):
    """output_value="token_embeddings": each text's per-token vectors (special tokens kept, padding left out), a
    torch tensor per text as sentence-transformers gives them, prompts included; and TEI's /embed_all serves the
    same vectors."""
    from fastapi.testclient import TestClient

    from kiln.serving.app import ServeConfig, create_app

    _, theirs, ours = pair
    for kwargs in ({}, {"prompt_name": "query"}):
        got, want = ours.encode(DOCUMENTS, output_value="token_embeddings", **kwargs), \
            theirs.encode(DOCUMENTS, output_value="token_embeddings", **kwargs)
        assert [tuple(g.shape) for g in got] == [tuple(w.shape) for w in want] and len({g.shape for g in got}) > 1
        for g, w in zip(got, want):
            assert isinstance(g, torch.Tensor)
            torch.testing.assert_close(g, w, atol=2e-5, rtol=0)
    single = ours.encode(DOCUMENTS[0], output_value="token_embeddings")
    torch.testing.assert_close(single, theirs.encode(DOCUMENTS[0], output_value="token_embeddings"), atol=2e-5,
                               rtol=0)
    model, _, _ = pair
    with TestClient(create_app(ServeConfig(models={"m": model.parent / "export"}))) as client:
        served = client.post("/embed_all", json={"inputs": DOCUMENTS, "prompt_name": "query"})
        ids = client.post("/embed_all", json={"inputs": [ours.tokenizer.encode(DOCUMENTS[0]).ids]})
    assert served.status_code == 200, served.text
    want = theirs.encode(DOCUMENTS, output_value="token_embeddings", prompt_name="query")
    for g, w in zip(served.json(), want):
        np.testing.assert_allclose(np.array(g), w.numpy(), atol=2e-5)
    assert ids.status_code == 200 and np.allclose(ids.json()[0], single.numpy(), atol=2e-5)


def test_what_kiln_does_not_return_is_refused_by_name(pair):
    ours = pair[2]
    with pytest.raises(UsageError, match="output_value must be 'sentence_embedding' or 'token_embeddings'"):
        ours.encode(DOCUMENTS, output_value=None)
    with pytest.raises(UsageError, match="truncate_dim, normalize_embeddings: applies to sentence embeddings"):
        ours.encode(DOCUMENTS, output_value="token_embeddings", truncate_dim=8, normalize_embeddings=True)
    with pytest.raises(UsageError, match="similarity_pairwise: both need the same shape"):
        ours.similarity_pairwise(ours.encode(QUERIES), ours.encode(DOCUMENTS))


def test_encode_cuts_sorted_texts_where_padding_costs_more_than_a_run(pair, monkeypatch):
    """encode(batch_size=32) runs the least-cost plan of kiln.runtime.batch_plan, not every 32 texts: a mixed set
    computes fewer tokens than sentence-transformers' fixed batches would, and answers the same as one text at a
    time."""
    from kiln.runtime.batch_plan import RUN_TOKENS, length_batches

    _, theirs, ours = pair
    texts = [s for s in builtin_sentences() if s][:40]
    shapes: list[tuple[int, int]] = []
    run = ours.engine.run
    monkeypatch.setattr(ours.engine, "run", lambda inputs: shapes.append(inputs["input_ids"].shape) or run(inputs))
    vectors = ours.encode(texts, batch_size=32)
    lengths = [len(e.ids) for e in ours.encoder.encode(texts)]
    planned = [(len(b), max(lengths[i] for i in b)) for b in length_batches(lengths, 32, ours.pad_multiple)]
    assert shapes == planned and len(shapes) > 2  # a spread of lengths: cut finer than two batches of 32 and 8
    fixed = sorted(lengths)
    fixed_cost = sum(len(fixed[b : b + 32]) * max(fixed[b : b + 32]) + RUN_TOKENS for b in range(0, 40, 32))
    assert sum(n * w + RUN_TOKENS for n, w in shapes) < fixed_cost
    np.testing.assert_allclose(vectors, np.stack([ours.encode(t) for t in texts]), atol=1e-5)
    np.testing.assert_allclose(vectors, theirs.encode(texts, batch_size=32), atol=1e-5)
