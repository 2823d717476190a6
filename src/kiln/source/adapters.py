"""Checkpoints that carry task LoRA adapters inside their weights, as jina-embeddings-v3 ships them, made into the
transformers class that computes them natively, with one adapter merged.

Jina's own code (``XLMRobertaLoRA``, loaded with ``trust_remote_code``) keeps every Linear and Embedding weight as
``<module>.parametrizations.weight.original`` beside ``...weight.0.lora_A`` / ``lora_B``, each stacked over the
adapters its config lists (``lora_adaptations``), and adds ``lora_B[i] @ lora_A[i] * lora_alpha / lora_rank`` (an
Embedding's pair the other way round: ``lora_A[i] @ lora_B[i]``) for the task a call names; no task, no adapter.
transformers ships the same encoder as ``JinaEmbeddingsV3Model``, which reads Jina's weight names but has no
adapters. kiln merges the chosen adapter into the weights (what vLLM does for this model, and what costs nothing
per text), writes the merged checkpoint with the native class's config, and loads that: one artifact per adapter.

The checkpoint's config says ``model_type: xlm-roberta``; read as plain XLM-R it would load none of its layers
(rotary positions, other names), which is why this conversion runs before the architecture is looked up.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kiln.errors import UnsupportedModelError, UsageError

ADAPTERS_KEY = "lora_adaptations"  # the adapters' names, in the order their weights are stacked
NATIVE_TYPE = "jina_embeddings_v3"
_ORIGINAL = ".parametrizations.weight.original"
_LORA_A, _LORA_B = ".parametrizations.weight.0.lora_A", ".parametrizations.weight.0.lora_B"
# The encoder's settings the native config shares with Jina's, under the same names.
_SHARED = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size", "hidden_act",
           "max_position_embeddings", "type_vocab_size", "initializer_range", "layer_norm_eps", "pad_token_id",
           "bos_token_id", "eos_token_id")


@dataclass(frozen=True)
class AdapterChoice:
    """Which of a checkpoint's adapters an artifact computes: ``name`` empty means none (the model's default)."""

    name: str
    available: tuple[str, ...]


def choose(config: Mapping[str, Any], adapter: str | None) -> AdapterChoice:
    """The adapter ``adapter`` names among the checkpoint's, or none; a name it lacks is a UsageError naming them."""
    available = tuple(str(a) for a in config.get(ADAPTERS_KEY) or ())
    if adapter is None:
        return AdapterChoice("", available)
    if not available:
        raise UsageError(f"adapter {adapter!r}: this model carries no task adapters (only checkpoints that list "
                         f"{ADAPTERS_KEY} in config.json, as jina-embeddings-v3, have them)")
    if adapter not in available:
        raise UsageError(f"adapter {adapter!r} is not one of this model's: {', '.join(available)}")
    return AdapterChoice(adapter, available)


def native_config(config: Mapping[str, Any]) -> dict[str, Any]:
    """Jina's XLM-R config as transformers' ``JinaEmbeddingsV3Config``, refusing what the native class lacks."""
    if config.get("position_embedding_type", "rotary") != "rotary":
        raise UnsupportedModelError(
            f"a task-adapter checkpoint with position_embedding_type {config.get('position_embedding_type')!r}: "
            "kiln converts Jina v3's rotary encoder only")
    native = {k: config[k] for k in _SHARED if k in config}
    native.update(model_type=NATIVE_TYPE, architectures=["JinaEmbeddingsV3Model"],
                  rope_parameters={"rope_type": "default", "rope_theta": float(config.get("rotary_emb_base", 10000.0))})
    return native


def merged_weights(tensors: Mapping[str, Any], index: int | None, scaling: float) -> dict[str, Any]:
    """The state dict with each parametrized weight replaced by its original plus adapter ``index``'s low-rank
    update (none: the original alone), in fp32; the adapters' own tensors dropped."""
    import torch

    merged: dict[str, Any] = {}
    for key, tensor in tensors.items():
        if key.endswith((_LORA_A, _LORA_B)):
            continue
        if not key.endswith(_ORIGINAL):
            merged[key] = tensor
            continue
        stem = key[: -len(_ORIGINAL)]
        weight = tensor.to(torch.float32)
        if index is not None:
            a, b = tensors[stem + _LORA_A][index].float(), tensors[stem + _LORA_B][index].float()
            weight = weight + _low_rank(a, b, tuple(weight.shape), stem) * scaling
        merged[stem + ".weight"] = weight.contiguous()
    return merged


def _low_rank(a: Any, b: Any, shape: tuple[int, ...], stem: str) -> Any:
    """A Linear's update is B @ A ((out, r) @ (r, in)); an Embedding's, A @ B ((rows, r) @ (r, dim)): the pair's
    shapes say which, so no module name is guessed."""
    if tuple(b.shape[:1]) + tuple(a.shape[1:]) == shape and b.shape[1] == a.shape[0]:
        return b @ a
    if tuple(a.shape[:1]) + tuple(b.shape[1:]) == shape and a.shape[1] == b.shape[0]:
        return a @ b
    raise UnsupportedModelError(f"{stem}: LoRA shapes {tuple(a.shape)} and {tuple(b.shape)} do not make its weight "
                                f"{shape}")


def write_native(model_dir: Path, config: Mapping[str, Any], choice: AdapterChoice, out: Path) -> None:
    """Write ``out``: the native config and the checkpoint's weights with ``choice``'s adapter merged."""
    from safetensors.torch import load_file, save_file

    tensors: dict[str, Any] = {}
    for path in sorted(model_dir.glob("*.safetensors")):
        tensors.update(load_file(path))
    index = choice.available.index(choice.name) if choice.name else None
    scaling = float(config.get("lora_alpha", 1)) / float(config.get("lora_rank", 1))
    out.mkdir(parents=True, exist_ok=True)
    save_file(merged_weights(tensors, index, scaling), out / "model.safetensors", metadata={"format": "pt"})
    (out / "config.json").write_text(json.dumps(native_config(config), indent=2))
