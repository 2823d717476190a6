"""EmbeddingGemma on a tiny random Gemma 3 with bidirectional attention (sliding layers see 8 positions on either
side), mean pooling, two Dense projections and its task prompts: kiln's vectors equal sentence-transformers' on
the same directory, with the window exercised; what kiln does not verify is refused with the reason."""

from __future__ import annotations

import shutil

import numpy as np
import pytest

import kiln
from kiln.data.texts import builtin_sentences
from kiln.errors import UnsupportedModelError
from kiln.source.loading import load_source
from kiln.tasks import TaskName
from kiln.testing.factory import write_sentence_transformers_files

PROMPTS = {"query": "task: search result | query: ", "document": "title: none | text: "}  # EmbeddingGemma's own
TEXTS = [*builtin_sentences()[:6], " ".join(builtin_sentences()[10:16])]  # the last one spans many windows


@pytest.fixture(scope="module")
def embedding_gemma(tiny_model, tmp_path_factory):
    model = tmp_path_factory.mktemp("embeddinggemma") / "model"
    shutil.copytree(tiny_model("gemma3_text"), model)
    write_sentence_transformers_files(model, prompts=PROMPTS, dense=(64, 24))
    return model, kiln.export(str(model), task="feature-extraction", output=model.parent / "export").artifact.path


def test_embedding_gemma_embeds_as_sentence_transformers_does(embedding_gemma):
    from sentence_transformers import SentenceTransformer

    model, artifact = embedding_gemma
    theirs = SentenceTransformer(str(model), device="cpu")
    ours = kiln.load(artifact)
    assert ours.config.dimension == 24  # the last projection's size, not the hidden size
    for name in (None, *PROMPTS):
        np.testing.assert_allclose(ours.encode(TEXTS, prompt_name=name), theirs.encode(TEXTS, prompt_name=name),
                                   atol=2e-5)
    np.testing.assert_allclose(ours.encode(TEXTS, truncate_dim=8), theirs.encode(TEXTS, truncate_dim=8), atol=2e-5)
    # kiln audit's reference pools the projected token states (it read .last_hidden_state of the module's mapping
    # and failed with AttributeError before)
    from kiln.auditing.reference import Reference
    from kiln.source.loading import load_source

    reference = Reference(load_source(str(model), "feature-extraction"))
    np.testing.assert_allclose(reference.vectors(TEXTS, reference.configured), theirs.encode(TEXTS), atol=2e-5)
    # its graph projects every token state (kiln.model.projected): no per-token vectors, said so
    with pytest.raises(kiln.UsageError, match="Dense projections run on every token state inside kiln's graph"):
        ours.encode(TEXTS, output_value="token_embeddings")


def test_the_pytorch_variants_carry_the_projections(embedding_gemma, tmp_path):
    """torch-fp16 saves the encoder with its Dense projections beside it and loads them back: judged like any
    variant, its vectors are sentence-transformers' to fp16 rounding."""
    from sentence_transformers import SentenceTransformer

    from kiln.optimizing.job import OptimizeConfig, OptimizeJob

    model, _ = embedding_gemma
    summary = OptimizeJob(OptimizeConfig(model=str(model), task=TaskName.FEATURE_EXTRACTION, output=tmp_path / "o",
                                         variants=("torch-fp16",))).run()
    (fp16,) = summary.outcomes
    assert fp16.status == "accepted" and summary.best == "torch-fp16", fp16.reason
    ours = kiln.load(tmp_path / "o" / "best")
    assert ours.config.dimension == 24
    got, want = ours.encode(TEXTS), SentenceTransformer(str(model), device="cpu").encode(TEXTS)
    assert got.shape == want.shape and (got * want).sum(1).min() > 0.999  # both normalized


def test_what_kiln_does_not_verify_of_embedding_gemma_is_refused(embedding_gemma, tmp_path):
    """Max pooling before the Dense projections is refused (a causal Gemma 3, without use_bidirectional_attention,
    is a generator: tests/integration/test_generation.py)."""
    max_pooled = tmp_path / "max"
    shutil.copytree(embedding_gemma[0], max_pooled)
    write_sentence_transformers_files(max_pooled, pooling="max", dense=(64, 24))
    with pytest.raises(UnsupportedModelError, match="max-pools before its Dense projections"):
        load_source(str(max_pooled), TaskName.FEATURE_EXTRACTION)
