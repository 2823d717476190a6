"""An encoder followed by sentence-transformers Dense projections, as one torch module: a ColBERT's (PyLate's
``1_Dense``; kiln.tasks.multi_vector) or an embedder's (EmbeddingGemma's 768 -> 3072 -> 768; kiln.tasks
.feature_extraction).

Exported, traced and run like any transformers model: keyword inputs in, a mapping out, with the projected token
states under ``output`` ([batch, tokens, dim], before any normalisation). The projections are applied to every token
state: for a ColBERT that is the model; for an embedder it equals projecting the pooled vector, as
sentence-transformers does, because its projections are affine (no activation) and every pooling kiln accepts with
them (mean, CLS, last token) is a weighted sum of token states or one of them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

# Why a module with projections cannot go where one transformers model is saved and reloaded alone.
CARRIES_PROJECTIONS = ("carries modules beside its transformers class (sentence-transformers Dense projections, "
                       "BGE-M3's sparse and ColBERT heads) that a saved transformers model would lose")


def is_projected(model: object) -> bool:
    """Whether ``model`` is an encoder with modules beside it (saving its transformers model alone loses them)."""
    return isinstance(model, EncoderWithModules)


class EncoderWithModules(torch.nn.Module):
    """A transformers encoder and modules a checkpoint stores beside it, run as one module (the projections here;
    BGE-M3's sparse and ColBERT heads in kiln.model.hybrid)."""

    def __init__(self, encoder: Any) -> None:
        super().__init__()
        self.encoder = encoder
        self.config = encoder.config  # what code reading a transformers model's settings asks for

    @property
    def dtype(self) -> torch.dtype:
        return self.encoder.dtype

    def token_states(self, **inputs: torch.Tensor) -> torch.Tensor:
        """The token states an embedder pools into its sentence vector ([batch, tokens, dim])."""
        raise NotImplementedError


def token_states(model: Any, **inputs: torch.Tensor) -> torch.Tensor:
    """What a sentence embedding is pooled from, for a transformers model or one with modules beside it."""
    return model.token_states(**inputs) if is_projected(model) else model(**inputs, return_dict=True).last_hidden_state


class ProjectedModel(EncoderWithModules):
    def __init__(self, encoder: Any, projections: Sequence[torch.nn.Linear], output: str) -> None:
        super().__init__(encoder)
        self.projections = torch.nn.ModuleList(projections)
        self.output = output

    def forward(self, return_dict: bool = True, **inputs: torch.Tensor) -> dict[str, torch.Tensor]:
        states = self.encoder(**inputs, return_dict=True).last_hidden_state
        for projection in self.projections:
            states = projection(states)
        return {self.output: states}

    def token_states(self, **inputs: torch.Tensor) -> torch.Tensor:
        return self(**inputs)[self.output]
