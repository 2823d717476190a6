"""Which architectures kiln exports and verifies (bidirectional encoders, and GPT-style decoders for the tasks
their heads serve), and why others are refused."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from kiln.errors import UnsupportedModelError


@dataclass(frozen=True)
class ArchSpec:
    """What kiln needs to know about a model family beyond its transformers config."""

    # RoBERTa-style embeddings number positions from padding_idx + 1, so two slots are never usable.
    position_offset: int = 0
    # A causal (decoder-only) language model: it does the tasks whose spec says ``decoders``.
    decoder: bool = False
    # A config.json key that, set true, makes this decoder family a bidirectional encoder (EmbeddingGemma's Gemma 3).
    bidirectional_key: str | None = None
    # Why kiln distill and prune refuse the family (empty: they do it).
    compress_refused: str = ""


SUPPORTED: dict[str, ArchSpec] = {
    "bert": ArchSpec(),
    "roberta": ArchSpec(position_offset=2),
    "xlm-roberta": ArchSpec(position_offset=2),
    "camembert": ArchSpec(position_offset=2),
    "distilbert": ArchSpec(),
    "albert": ArchSpec(),
    "electra": ArchSpec(),
    "mpnet": ArchSpec(position_offset=2),
    "deberta-v2": ArchSpec(),
    # Rotary positions, alternating global and sliding-window attention; exported with eager attention.
    "modernbert": ArchSpec(),
    # Rotary positions (no learned position table), exported with eager attention.
    "nomic_bert": ArchSpec(),
    "gte": ArchSpec(),
    "jina_embeddings_v3": ArchSpec(),
    # Gemma 3's text model: the Gemma-3 language models generate (grouped-query attention, q/k norms, alternating
    # sliding-window and global layers with their own rotary bases; kiln's step graph masks the window); with
    # use_bidirectional_attention it is EmbeddingGemma, an encoder (sliding layers see a window on both sides;
    # kiln builds its masks, kiln.model.masks).
    "gemma3_text": ArchSpec(decoder=True, bidirectional_key="use_bidirectional_attention",
                            compress_refused="its per-layer attention types and q/k norms are not handled by kiln's "
                                             "layer selection or head slicing yet"),
    # Qwen3: a causal encoder (no KV cache) as Qwen3-Embedding and Qwen3-Reranker use it, pooled or scored at each
    # text's last real token; and a generator (Qwen3-0.6B and up) with grouped-query attention's smaller cache.
    "qwen3": ArchSpec(decoder=True),
    # Llama-family generators (Llama 3.x, SmolLM2): rotary positions (Llama 3's frequency scaling included),
    # grouped-query attention, RMSNorm, SwiGLU.
    "llama": ArchSpec(decoder=True),
    "gpt2": ArchSpec(decoder=True),
    # Alternating global and local (windowed) attention, as in its transformers implementation.
    "gpt_neo": ArchSpec(decoder=True),
}

# Families people try that kiln knowingly refuses, with the reason it gives.
REFUSED: dict[str, str] = {
    "qwen2": "gte-Qwen2, the Qwen2 embedder people run, attends bidirectionally through its own code (auto_map, "
             "trust_remote_code), while transformers' Qwen2 is causal: kiln would compute other vectors than the "
             "model's, so it refuses the family (its causal embedders and generation are verified on Qwen3)",
    "embedding_gemma2_text": "EmbeddingGemma 2 (transformers' multimodal embedding_gemma2, text part) is not built "
                             "yet; EmbeddingGemma (gemma3_text with bidirectional attention) is supported",
    "mistral": "Mistral-7B-class embedders (E5-Mistral, SFR) are not built: their fp32 weights alone are ~28 GB "
               "(7.1B parameters x 4 bytes), beyond the machines kiln verifies on",
    "t5": "it is an encoder-decoder model; kiln exports encoder-only models",
    "bart": "it is an encoder-decoder model; kiln exports encoder-only models",
    "deberta": "DeBERTa v1's relative-position attention is not verified by kiln; use DeBERTa-v2/v3",
    "longformer": "its sliding-window attention exports with sequence-dependent control flow kiln cannot verify",
}


def check_task(model_type: str, arch: ArchSpec, task: str) -> None:
    """Refuse a task the family cannot do: generation needs a decoder; a decoder does only its tasks."""
    from kiln.tasks import TASKS

    generating = sorted(n for n, a in SUPPORTED.items() if a.decoder)
    TASKS[task].check_architecture(model_type, arch.decoder, generating)


def for_config(arch: ArchSpec, config: Mapping[str, Any]) -> ArchSpec:
    """The family's spec for this config: a decoder family whose config makes it bidirectional is an encoder."""
    if arch.bidirectional_key is not None and config.get(arch.bidirectional_key):
        return replace(arch, decoder=False)
    return arch


def arch_spec(model_type: str, custom_code: str | None = None) -> ArchSpec:
    """Return the spec for ``model_type`` or raise an error naming it, the reason and what works. ``custom_code``:
    the class a config's ``auto_map`` names (a model that needs ``trust_remote_code``)."""
    if model_type in SUPPORTED:
        return SUPPORTED[model_type]
    reason = REFUSED.get(model_type, "kiln has no export and parity tests for it")
    if custom_code and model_type not in REFUSED:
        reason = (f"it needs its own code ({custom_code}, trust_remote_code), which kiln does not run: kiln "
                  "verifies the classes transformers itself ships")
    supported = ", ".join(sorted(SUPPORTED))
    raise UnsupportedModelError(
        f"architecture {model_type!r} is not supported: {reason}. Supported architectures: {supported}"
    )
