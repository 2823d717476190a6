"""Loading: the bundled default, local directories, hub ids offline, pickle refusal, unsupported models."""

from __future__ import annotations

import json
import shutil

import pytest

from kiln.choices import Pooling
from kiln.errors import ModelLoadError, UnsupportedModelError
from kiln.source.loading import load_source
from kiln.tasks import TaskName


def test_bundled_default_model():
    source = load_source(None, TaskName.FEATURE_EXTRACTION)
    assert source.model_type == "bert"
    assert source.task_config.pooling is Pooling.MEAN and source.task_config.normalize
    assert source.task_config.max_length == 256  # sentence_bert_config.json's max_seq_length
    assert source.input_names == ("input_ids", "attention_mask", "token_type_ids")
    assert "bundled" in source.name


def test_missing_directory():
    with pytest.raises(ModelLoadError, match="model directory ./no/such/model does not exist"):
        load_source("./no/such/model", TaskName.FEATURE_EXTRACTION)


def test_file_instead_of_directory(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(ModelLoadError, match="is a file; pass the directory that holds config.json"):
        load_source(str(tmp_path / "config.json"), TaskName.FEATURE_EXTRACTION)


def test_hub_id_offline_says_to_pass_a_directory(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ModelLoadError, match="could not fetch 'someone/some-model' .*pass a local model directory"):
        load_source("someone/some-model", TaskName.FEATURE_EXTRACTION)


def test_pickle_weights_refused_unless_allowed(tiny_model, tmp_path):
    import torch
    from safetensors.torch import load_file

    model_dir = tmp_path / "pickled"
    shutil.copytree(tiny_model("bert"), model_dir)
    weights = load_file(model_dir / "model.safetensors")
    (model_dir / "model.safetensors").unlink()
    torch.save(weights, model_dir / "pytorch_model.bin")
    with pytest.raises(ModelLoadError, match=r"only pickle weights \(pytorch_model.bin\). Unpickling can run "
                                             "arbitrary code.*--allow-pickle"):
        load_source(str(model_dir), TaskName.FEATURE_EXTRACTION)
    source = load_source(str(model_dir), TaskName.FEATURE_EXTRACTION, allow_pickle=True)
    assert source.model_type == "bert"


def test_no_weights(tiny_model, tmp_path):
    model_dir = tmp_path / "empty"
    shutil.copytree(tiny_model("bert"), model_dir)
    (model_dir / "model.safetensors").unlink()
    with pytest.raises(ModelLoadError, match="holds no weights"):
        load_source(str(model_dir), TaskName.FEATURE_EXTRACTION)


@pytest.mark.parametrize(("model_type", "reason"), [
    ("mistral", "Mistral-7B-class embedders .E5-Mistral, SFR. are not built"),
    ("whisper", "kiln has no export and parity tests for it"),
])
def test_unsupported_architecture_is_named(tmp_path, model_type, reason):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": model_type}))
    with pytest.raises(UnsupportedModelError, match=f"architecture '{model_type}' is not supported: {reason}.*"
                                                    "Supported architectures: albert, bert, camembert"):
        load_source(str(tmp_path), TaskName.FEATURE_EXTRACTION)


def test_a_model_that_needs_its_own_code_is_refused_naming_it(tmp_path, tiny_model):
    """A config whose auto_map names custom code (trust_remote_code) for a family transformers does not ship; a
    family it does ship (nomic_bert) loads with transformers' own class, whatever its auto_map says."""
    custom = "acme/acme-encoder--modeling_acme.AcmeModel"
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "acme_bert", "auto_map": {"AutoModel": custom}}))
    with pytest.raises(UnsupportedModelError, match=f"'acme_bert' is not supported: it needs its own code "
                                                    f"\\({custom}, trust_remote_code\\), which kiln does not run"):
        load_source(str(tmp_path), TaskName.FEATURE_EXTRACTION)
    nomic = tmp_path / "nomic"  # as nomic-embed-text's hub config: auto_map to its own modeling file
    shutil.copytree(tiny_model("nomic_bert"), nomic)
    config = json.loads((nomic / "config.json").read_text())
    config["auto_map"] = {"AutoModel": "nomic-ai/nomic-bert-2048--modeling_hf_nomic_bert.NomicBertModel"}
    (nomic / "config.json").write_text(json.dumps(config))
    assert type(load_source(str(nomic), TaskName.FEATURE_EXTRACTION).model).__name__ == "NomicBertModel"


def test_untrained_head_is_refused(tiny_model):
    with pytest.raises(UnsupportedModelError, match="has no trained text-classification head"):
        load_source(str(tiny_model("bert")), TaskName.TEXT_CLASSIFICATION)


def test_a_tokenizer_with_ids_past_the_embedding_is_refused(tiny_model, tmp_path):
    """Tokens added to the tokenizer without resizing the model's embedding: refused at load, naming both sizes."""
    import transformers

    model_dir = tmp_path / "added"
    shutil.copytree(tiny_model("bert"), model_dir)
    tokenizer = transformers.AutoTokenizer.from_pretrained(model_dir)
    tokenizer.add_tokens(["kilnword", "kilnother"])
    tokenizer.save_pretrained(model_dir)
    with pytest.raises(UnsupportedModelError, match=r"tokenizer has 502 tokens \(ids 0 to 501\) but its input "
                                                    r"embedding has 500 rows: ids 500 and up would have no vector"):
        load_source(str(model_dir), TaskName.FEATURE_EXTRACTION)


def test_unknown_sentence_transformers_module(tiny_model, tmp_path):
    model_dir = tmp_path / "st"
    shutil.copytree(tiny_model("bert"), model_dir)
    (model_dir / "modules.json").write_text(json.dumps([
        {"idx": 0, "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "path": "2_LayerNorm", "type": "sentence_transformers.models.LayerNorm"}]))
    with pytest.raises(UnsupportedModelError, match="modules kiln does not reproduce: LayerNorm"):
        load_source(str(model_dir), TaskName.FEATURE_EXTRACTION)


def test_roberta_max_length_accounts_for_position_offset(tiny_model):
    source = load_source(str(tiny_model("roberta")), TaskName.FEATURE_EXTRACTION)
    assert source.task_config.max_length == 128  # 130 positions minus RoBERTa's padding offset


def test_a_checkpoint_stored_in_bf16_is_the_fp32_original(tiny_model, tmp_path):
    """transformers 5 loads a checkpoint saved in bf16 (Qwen3-Embedding's, Jina v3's) as bf16; the original kiln judges
    every variant against is fp32: the stored weights exactly, computed at full precision."""
    import torch
    import transformers

    model = tmp_path / "bf16"
    stored = transformers.AutoModel.from_pretrained(tiny_model("bert")).to(torch.bfloat16)
    stored.save_pretrained(model)
    for tokenizer_file in tiny_model("bert").glob("tokenizer*"):
        shutil.copy(tokenizer_file, model / tokenizer_file.name)
    assert json.loads((model / "config.json").read_text())["dtype"] == "bfloat16"
    loaded = load_source(str(model), TaskName.FEATURE_EXTRACTION).model
    assert {p.dtype for p in loaded.parameters()} == {torch.float32}
    weights = dict(stored.named_parameters())
    assert all(torch.equal(p, weights[n].float()) for n, p in loaded.named_parameters())
