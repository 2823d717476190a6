"""BGE-M3's one forward with three outputs, as one torch module (kiln.tasks.hybrid_embedding).

FlagEmbedding's M3 model is an XLM-R encoder and two linear heads stored beside it (``sparse_linear.pt``: hidden ->
1, ``colbert_linear.pt``: hidden -> hidden). From the last hidden states ``h`` it computes (FlagEmbedding 1.4.2,
``finetune/embedder/encoder_only/m3/modeling.py``):

- the dense vector: ``h[:, 0]`` (CLS), then L2-normalised;
- the lexical (sparse) weights: ``relu(sparse_linear(h))``, one weight per token, later kept per token id as the
  largest weight of its occurrences, special tokens left out;
- the ColBERT vectors: ``colbert_linear(h[:, 1:])`` (every token after CLS), padding dropped, each L2-normalised.

The graph returns the three raw tensors (the ColBERT head is applied at every position, CLS included, so the graph
needs no slicing: the runtime drops position 0 with the padding); what is per-id or per-row stays in numpy. Their
names are the task's (``outputs``: the dense vector's, the token weights', the token vectors'), as a projected
model's output is.
"""

from __future__ import annotations

from typing import Any

import torch

from kiln.model.projected import EncoderWithModules, linear_of, linear_shape


class HybridModel(EncoderWithModules):
    def __init__(self, encoder: Any, sparse: torch.nn.Linear, colbert: torch.nn.Linear,
                 outputs: tuple[str, str, str]) -> None:
        super().__init__(encoder)
        self.sparse = sparse
        self.colbert = colbert
        self.outputs = outputs

    def token_states(self, **inputs: torch.Tensor) -> torch.Tensor:
        """The encoder's: the dense vector is the first of them (CLS pooling)."""
        return self.encoder(**inputs, return_dict=True).last_hidden_state

    def described(self) -> dict[str, Any]:
        return {"sparse": linear_shape(self.sparse), "colbert": linear_shape(self.colbert),
                "outputs": list(self.outputs)}

    @classmethod
    def rebuilt(cls, encoder: Any, described: dict[str, Any]) -> HybridModel:
        return cls(encoder, linear_of(described["sparse"]), linear_of(described["colbert"]),
                   tuple(described["outputs"]))

    def forward(self, return_dict: bool = True, **inputs: torch.Tensor) -> dict[str, torch.Tensor]:
        states = self.token_states(**inputs)
        dense, weights, vectors = self.outputs
        return {dense: states[:, 0], weights: torch.relu(self.sparse(states)).squeeze(-1),
                vectors: self.colbert(states)}
