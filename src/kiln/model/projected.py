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


def linear_shape(layer: torch.nn.Linear) -> list[int | bool]:
    """[in, out, has bias]: what rebuilds ``layer`` empty before its weights are loaded."""
    return [int(layer.in_features), int(layer.out_features), layer.bias is not None]


def linear_of(shape: list[int | bool]) -> torch.nn.Linear:
    return torch.nn.Linear(int(shape[0]), int(shape[1]), bias=bool(shape[2]))


class EncoderWithModules(torch.nn.Module):
    """A transformers encoder and modules a checkpoint stores beside it, run as one module (the projections here;
    BGE-M3's sparse and ColBERT heads in kiln.model.hybrid).

    Saved as the encoder's own transformers files plus the side modules' weights and a description of their shapes
    (kiln.model.module.save_task_module), so the PyTorch variants (torch-bf16, torch-fp16) carry them too: each
    subclass says what rebuilds it (``described`` / ``rebuilt``)."""

    def __init__(self, encoder: Any) -> None:
        super().__init__()
        self.encoder = encoder
        self.config = encoder.config  # what code reading a transformers model's settings asks for

    def described(self) -> dict[str, Any]:
        """JSON: everything beside the encoder that ``rebuilt`` needs to make this module again (not the weights)."""
        raise NotImplementedError

    @classmethod
    def rebuilt(cls, encoder: Any, described: dict[str, Any]) -> EncoderWithModules:
        """This module around ``encoder``, its side modules empty (of the described shapes)."""
        raise NotImplementedError

    def side_state(self) -> dict[str, torch.Tensor]:
        """The weights of every module beside the encoder, by their names in this module."""
        return {name: tensor.detach().contiguous() for name, tensor in self.state_dict().items()
                if not name.startswith("encoder.")}

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

    def described(self) -> dict[str, Any]:
        return {"projections": [linear_shape(p) for p in self.projections], "output": self.output}

    @classmethod
    def rebuilt(cls, encoder: Any, described: dict[str, Any]) -> ProjectedModel:
        return cls(encoder, [linear_of(shape) for shape in described["projections"]], described["output"])
