"""A ColBERT checkpoint as one torch module: the encoder, then its Dense projections (kiln.tasks.multi_vector.task).

Exported, traced and run like any transformers model: keyword inputs in, a mapping out, with the projected token
states as ``token_embeddings`` ([batch, tokens, dim], before normalisation, as PyLate's Dense returns them).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch


class LateInteractionModel(torch.nn.Module):
    def __init__(self, encoder: Any, projections: Sequence[torch.nn.Linear]) -> None:
        super().__init__()
        self.encoder = encoder
        self.projections = torch.nn.ModuleList(projections)
        self.config = encoder.config  # what code reading a transformers model's settings asks for

    def forward(self, return_dict: bool = True, **inputs: torch.Tensor) -> dict[str, torch.Tensor]:
        states = self.encoder(**inputs, return_dict=True).last_hidden_state
        for projection in self.projections:
            states = projection(states)
        return {"token_embeddings": states}
