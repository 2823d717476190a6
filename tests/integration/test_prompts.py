"""A model's named prompts (config_sentence_transformers.json) work as sentence-transformers applies them, in
encode(), on kiln's /kiln/embed and on TEI's /embed, for a NomicBERT (nomic-embed's ``search_query: `` /
``search_document: ``); a name the model does not define is refused, naming those it has."""

from __future__ import annotations

import shutil

import numpy as np
import pytest
from fastapi.testclient import TestClient

import kiln
from kiln.data.texts import builtin_sentences
from kiln.errors import UnsupportedModelError, UsageError
from kiln.serving.app import ServeConfig, create_app
from kiln.source.loading import load_source
from kiln.tasks import TaskName
from kiln.testing.factory import write_sentence_transformers_files

PROMPTS = {"query": "search_query: ", "document": "search_document: "}
TEXTS = list(builtin_sentences()[:6])


@pytest.fixture(scope="module")
def nomic(tiny_model, tmp_path_factory):
    """A tiny NomicBERT with nomic-embed's prompts, and its ONNX export."""
    model = tmp_path_factory.mktemp("nomic") / "model"
    shutil.copytree(tiny_model("nomic_bert"), model)
    write_sentence_transformers_files(model, prompts=PROMPTS)
    exported = kiln.export(str(model), task="feature-extraction", output=model.parent / "export")
    return model, exported.artifact.path


def test_named_prompts_embed_as_sentence_transformers_does(nomic):
    from sentence_transformers import SentenceTransformer

    model, artifact = nomic
    theirs = SentenceTransformer(str(model), device="cpu")
    ours = kiln.load(artifact)
    for name, prompt in PROMPTS.items():
        want = theirs.encode(TEXTS, prompt_name=name)
        np.testing.assert_allclose(ours.encode(TEXTS, prompt_name=name), want, atol=2e-5)
        np.testing.assert_allclose(ours.encode(TEXTS, prompt=prompt), want, atol=2e-5)
    np.testing.assert_allclose(ours.encode(TEXTS), theirs.encode(TEXTS), atol=2e-5)  # no default prompt: none
    assert not np.allclose(ours.encode(TEXTS[:1], prompt_name="query"), ours.encode(TEXTS[:1]), atol=1e-3)


def test_the_default_prompt_applies_when_none_is_named(nomic, tmp_path):
    from sentence_transformers import SentenceTransformer

    model = tmp_path / "default"
    shutil.copytree(nomic[0], model)
    write_sentence_transformers_files(model, prompts=PROMPTS, default_prompt_name="document")
    source = load_source(str(model), TaskName.FEATURE_EXTRACTION)
    assert source.task_config.prompts == PROMPTS and source.task_config.default_prompt_name == "document"
    theirs = SentenceTransformer(str(model), device="cpu")
    ours = kiln.load(kiln.export(str(model), task="feature-extraction", output=tmp_path / "out").artifact.path)
    np.testing.assert_allclose(ours.encode(TEXTS), theirs.encode(TEXTS), atol=2e-5)
    np.testing.assert_allclose(ours.encode(TEXTS, prompt_name="query"), theirs.encode(TEXTS, prompt_name="query"),
                               atol=2e-5)


def test_bad_prompts_are_refused_by_name(nomic, tmp_path):
    ours = kiln.load(nomic[1])
    with pytest.raises(UsageError, match="prompt_name must be one of the model's prompts: 'document', 'query' "
                                         r"\(got 'passage'\)"):
        ours.encode(TEXTS, prompt_name="passage")
    with pytest.raises(UsageError, match="prompt and prompt_name: pass one of them"):
        ours.encode(TEXTS, prompt_name="query", prompt="query: ")
    with pytest.raises(UsageError, match="chunking: a prompt"):
        ours.predict(TEXTS, prompt_name="query", chunking={"size": 8})
    model = tmp_path / "without"
    shutil.copytree(nomic[0], model)
    write_sentence_transformers_files(model, prompts=PROMPTS, include_prompt=False)
    with pytest.raises(UnsupportedModelError, match="pools without its prompt's tokens"):
        load_source(str(model), TaskName.FEATURE_EXTRACTION)


def test_served_routes_take_the_prompt_name(nomic):
    ours = kiln.load(nomic[1])
    with TestClient(create_app(ServeConfig(models={"nomic": nomic[1]}))) as client:
        got = client.post("/kiln/embed", json={"inputs": TEXTS, "prompt_name": "query"})
        assert got.status_code == 200, got.text
        np.testing.assert_allclose(got.json()["embeddings"], ours.encode(TEXTS, prompt_name="query"), atol=1e-5)
        refused = client.post("/kiln/embed", json={"inputs": TEXTS, "prompt_name": "passage"})
        assert refused.status_code == 422 and "'document', 'query'" in refused.text
        assert "prompt_name" in client.get("/openapi.json").json()["components"]["schemas"]["EmbedRequest"][
            "properties"]
    with TestClient(create_app(ServeConfig(models={"nomic": nomic[1]}, protocols=("tei",)))) as client:
        tei = client.post("/embed", json={"inputs": TEXTS, "prompt_name": "document"})
        assert tei.status_code == 200, tei.text
        np.testing.assert_allclose(tei.json(), ours.encode(TEXTS, prompt_name="document"), atol=1e-5)
        refused = client.post("/embed", json={"inputs": TEXTS, "prompt_name": "passage"})
        assert refused.status_code == 422 and "'document', 'query'" in refused.text
