"""jina-embeddings-v3 as Jina's own code saves it (task LoRA adapters inside the weights, model_type xlm-roberta with
an auto_map): kiln merges the adapter ``--adapter`` names and computes what Jina's formula gives, checked against
sentence-transformers on a native checkpoint with that adapter's update added by the test (an independent path:
transformers' own class, no kiln code); a checkpoint whose layers transformers' class cannot find is refused."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import numpy as np
import pytest
import torch
import transformers

import kiln
from kiln.data.texts import builtin_sentences
from kiln.errors import UnsupportedModelError, UsageError
from kiln.source.loading import load_source
from kiln.tasks import TaskName
from kiln.testing.factory import (
    JINA_ADAPTERS,
    JINA_PROMPTS,
    build_tiny_jina_v3,
    build_tiny_model,
    write_sentence_transformers_files,
)

TEXTS = list(builtin_sentences()[:6])


@pytest.fixture(scope="module")
def jina(tmp_path_factory):
    """The tiny Jina-layout checkpoint, and per adapter (None: no adapter) a transformers-native
    sentence-transformers model with that adapter's update added to its weights."""
    root = tmp_path_factory.mktemp("jina")
    deltas = build_tiny_jina_v3(root / "jina")
    build_tiny_model("jina_embeddings_v3", TaskName.FEATURE_EXTRACTION, root / "base")  # the same seed's weights
    natives = {}
    for adapter in (None, "retrieval.query", "text-matching"):
        model = transformers.JinaEmbeddingsV3Model.from_pretrained(root / "base")
        with torch.no_grad():
            for name, param in model.named_parameters():
                param += deltas[adapter][name] if adapter and name in deltas[adapter] else 0
        out = root / f"native-{adapter}"
        model.save_pretrained(out)
        for tokenizer_file in ("tokenizer.json", "tokenizer_config.json"):
            shutil.copy(root / "jina" / tokenizer_file, out / tokenizer_file)
        write_sentence_transformers_files(out, pooling="mean", normalize=True, prompts=JINA_PROMPTS)
        natives[adapter] = out
    return root / "jina", natives


@pytest.mark.parametrize("adapter", [None, "retrieval.query", "text-matching"])
def test_an_adapter_exports_as_its_merged_weights_compute(jina, adapter, tmp_path):
    from sentence_transformers import SentenceTransformer

    checkpoint, natives = jina
    exported = kiln.export(str(checkpoint), task="feature-extraction", output=tmp_path / "out", adapter=adapter)
    assert exported.manifest.source.adapter == (adapter or "")
    assert exported.manifest.source.architecture == "JinaEmbeddingsV3Model"
    ours, theirs = kiln.load(exported.path), SentenceTransformer(str(natives[adapter]), device="cpu")
    for prompt_name in (None, "retrieval.query"):
        np.testing.assert_allclose(ours.encode(TEXTS, prompt_name=prompt_name),
                                   theirs.encode(TEXTS, prompt_name=prompt_name), atol=2e-5)


def test_adapters_compute_different_vectors(jina):
    """The adapters are not a no-op on the tiny model: each merged one moves the vectors off the base model's."""
    checkpoint, _ = jina
    batch = load_source(str(checkpoint), TaskName.FEATURE_EXTRACTION).tokenizer(TEXTS, padding=True,
                                                                                return_tensors="pt")
    states = {}
    for adapter in (None, *JINA_ADAPTERS[:2]):
        with torch.no_grad():
            states[adapter] = load_source(str(checkpoint), TaskName.FEATURE_EXTRACTION,
                                          adapter=adapter).model(**batch).last_hidden_state[:, 0]
    cosine = torch.nn.functional.cosine_similarity
    assert cosine(states[None], states["retrieval.query"]).max() < 0.999
    assert cosine(states["retrieval.query"], states["retrieval.passage"]).max() < 0.999


def test_adapter_names_are_checked(jina, tiny_model):
    checkpoint, _ = jina
    with pytest.raises(UsageError, match="adapter 'retrieval' is not one of this model's: retrieval.query, "
                                         "retrieval.passage, separation, classification, text-matching"):
        load_source(str(checkpoint), TaskName.FEATURE_EXTRACTION, adapter="retrieval")
    with pytest.raises(UsageError, match="adapter 'retrieval.query': this model carries no task adapters"):
        load_source(str(tiny_model("bert")), TaskName.FEATURE_EXTRACTION, adapter="retrieval.query")


def test_the_cli_names_the_flag(jina, tmp_path):
    """kiln's CLI speaks in flags: the library's ``adapter`` is ``--adapter``, with a non-zero exit and no traceback."""
    checkpoint, _ = jina
    run = subprocess.run([sys.executable, "-m", "kiln", "export", str(checkpoint), "--adapter", "retrieval", "-o",
                          str(tmp_path / "out")], capture_output=True, text=True)
    assert run.returncode != 0 and "Traceback" not in run.stderr
    assert "--adapter 'retrieval' is not one of this model's: retrieval.query" in run.stderr
    assert not (tmp_path / "out").exists()


def test_a_checkpoint_whose_layers_its_class_cannot_find_is_refused(jina, tmp_path):
    """Without its adapters' list the same checkpoint reads as plain XLM-R, whose class finds none of its layers
    (Jina's names, rotary positions): loaded, it would answer from random weights. kiln refuses it and names the
    custom code its config points to."""
    checkpoint = tmp_path / "jina"
    shutil.copytree(jina[0], checkpoint)
    config = json.loads((checkpoint / "config.json").read_text())
    del config["lora_adaptations"]
    (checkpoint / "config.json").write_text(json.dumps(config))
    with pytest.raises(UnsupportedModelError, match=r"lacks \d+ weights its transformers class needs .*random layers; "
                                                    r"its config names its own code \(jinaai/xlm-roberta-flash-"
                                                    r"implementation--modeling_lora.XLMRobertaLoRA"):
        load_source(str(checkpoint), TaskName.FEATURE_EXTRACTION)
