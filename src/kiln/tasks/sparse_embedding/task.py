"""Sparse embeddings SPLADE-style: a masked-LM's logits as term weights over the vocabulary.

Inside the exported graph, per text: ``max over tokens of log(1 + relu(logits))`` with padding masked (what
sentence-transformers' SpladePooling and TEI compute), so the engine returns one vocabulary-sized vector per
text instead of one per token. Post-processing sets the tokenizer's special tokens' terms to zero ([CLS],
[SEP], [PAD] are no evidence of relevance and would match every document) and keeps the terms above
``threshold``, optionally the ``top_k`` heaviest, as (index, value) pairs.
Agreement: cosine of the sparse vectors (gate: min >= 1 - t, mean >= 1 - t/2) and the overlap of the top-10
terms. Task metric: STS Spearman of the dot-product similarity (kiln's built-in pairs by default).
Route: POST /embed_sparse.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from kiln.choices import TruncationSide, parse_choice
from kiln.errors import UsageError
from kiln.runtime.features import Prepared, one_per_input
from kiln.tasks.base import TaskSpec
from kiln.tasks.sparse_embedding.export import SparseEmbeddingExport
from kiln.tasks.sparse_embedding.validation import SparseEmbeddingValidation


@dataclass(frozen=True)
class SparseVector:
    """The non-zero terms of one text: vocabulary indices (ascending) and their weights."""

    indices: tuple[int, ...]
    values: tuple[float, ...]

    def dense(self, size: int) -> np.ndarray:
        out = np.zeros(size, dtype=np.float32)
        out[list(self.indices)] = self.values
        return out


def kept_terms(indices: np.ndarray, values: np.ndarray, threshold: float, top_k: int | None) -> SparseVector:
    """The terms (``indices`` ascending, their ``values``) whose weight is above ``threshold``, then the ``top_k``
    heaviest of them (ties: the lower index first)."""
    kept = np.flatnonzero(values > threshold)
    if top_k is not None and len(kept) > top_k:
        kept = np.sort(kept[np.argsort(-values[kept], kind="stable")[:top_k]])
    return SparseVector(tuple(int(i) for i in indices[kept]), tuple(float(v) for v in values[kept]))


@dataclass(frozen=True)
class SparseOptions:
    threshold: float = 0.0  # keep terms whose weight is above this
    top_k: int | None = None  # then the heaviest k (None: all)
    truncate: bool = True
    truncation_side: TruncationSide = TruncationSide.RIGHT  # which end an over-long input loses (TEI's direction)


class SparseEmbedding(TaskSpec):
    validation = SparseEmbeddingValidation
    export = SparseEmbeddingExport
    name = "sparse-embedding"

    def options(self, threshold: float = 0.0, top_k: int | None = None, truncate: bool = True,
                truncation_side: str | TruncationSide = TruncationSide.RIGHT) -> SparseOptions:
        side = parse_choice(TruncationSide, truncation_side, "truncation_side")
        if threshold < 0:
            raise UsageError(f"threshold must be at least 0 (got {threshold})")
        if top_k is not None and top_k < 1:
            raise UsageError(f"top_k must be at least 1, or None for every term (got {top_k})")
        return SparseOptions(float(threshold), top_k, truncate, side)

    def prepare(self, inputs: Sequence[Any], encoder, options: SparseOptions) -> Prepared:
        return one_per_input(inputs, encoder.encode(inputs, truncate=options.truncate, offsets=self.needs_offsets,
                                                    side=options.truncation_side))

    def reduce(self, outputs: dict[str, np.ndarray], attention_mask: np.ndarray) -> list[np.ndarray]:
        weights = outputs["sparse_embedding"].astype(np.float32, copy=True)
        weights[:, list(self.config.special_ids)] = 0.0
        return list(weights)

    def finalize(self, prepared: Prepared, reduced: Sequence[Any], options: SparseOptions,
                 encoder) -> list[SparseVector]:
        return [kept_terms(np.arange(len(weights)), weights, options.threshold, options.top_k) for weights in reduced]


