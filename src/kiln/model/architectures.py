"""Which encoder architectures kiln exports and verifies, and why others are refused."""

from __future__ import annotations

from dataclasses import dataclass

from kiln.errors import UnsupportedModelError


@dataclass(frozen=True)
class ArchSpec:
    """What kiln needs to know about a model family beyond its transformers config."""

    # RoBERTa-style embeddings number positions from padding_idx + 1, so two slots are never usable.
    position_offset: int = 0


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
}

# Families people try that kiln knowingly refuses, with the reason it gives.
REFUSED: dict[str, str] = {
    "gpt2": "it is a decoder-only causal language model; kiln optimizes bidirectional encoders",
    "llama": "it is a decoder-only causal language model; kiln optimizes bidirectional encoders",
    "t5": "it is an encoder-decoder model; kiln exports encoder-only models",
    "bart": "it is an encoder-decoder model; kiln exports encoder-only models",
    "deberta": "DeBERTa v1's relative-position attention is not verified by kiln; use DeBERTa-v2/v3",
    "longformer": "its sliding-window attention exports with sequence-dependent control flow kiln cannot verify",
}


def arch_spec(model_type: str) -> ArchSpec:
    """Return the spec for ``model_type`` or raise an error naming it, the reason and what works."""
    if model_type in SUPPORTED:
        return SUPPORTED[model_type]
    reason = REFUSED.get(model_type, "kiln has no export and parity tests for it")
    supported = ", ".join(sorted(SUPPORTED))
    raise UnsupportedModelError(
        f"architecture {model_type!r} is not supported: {reason}. Supported architectures: {supported}"
    )
