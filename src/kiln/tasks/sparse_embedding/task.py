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

from kiln.errors import UsageError
from kiln.records.figures import Agreement, AgreementInputs, EvalSet, Floor, Run
from kiln.runtime.features import Prepared
from kiln.scoring import spearman
from kiln.tasks.base import TaskSpec
from kiln.tasks.feature_extraction.task import FeatureExtraction
from kiln.tasks.sparse_embedding.export import SparseEmbeddingExport

TOP_TERMS = 10  # agreement's term overlap


@dataclass(frozen=True)
class SparseVector:
    """The non-zero terms of one text: vocabulary indices (ascending) and their weights."""

    indices: tuple[int, ...]
    values: tuple[float, ...]

    def dense(self, size: int) -> np.ndarray:
        out = np.zeros(size, dtype=np.float32)
        out[list(self.indices)] = self.values
        return out


@dataclass(frozen=True)
class SparseOptions:
    threshold: float = 0.0  # keep terms whose weight is above this
    top_k: int | None = None  # then the heaviest k (None: all)
    truncate: bool = True


class SparseEmbedding(TaskSpec):
    export = SparseEmbeddingExport
    name = "sparse-embedding"
    default_tolerance = 0.02
    tolerance_help = f"min cosine >= 1-t and mean cosine >= 1-t/2 (top-{TOP_TERMS} term overlap reported)"
    metric = "spearman"
    eval_fields = FeatureExtraction.eval_fields
    has_builtin_eval = True

    def options(self, threshold: float = 0.0, top_k: int | None = None, truncate: bool = True) -> SparseOptions:
        if threshold < 0:
            raise UsageError(f"threshold must be at least 0 (got {threshold})")
        if top_k is not None and top_k < 1:
            raise UsageError(f"top_k must be at least 1, or None for every term (got {top_k})")
        return SparseOptions(float(threshold), top_k, truncate)

    def reduce(self, outputs: dict[str, np.ndarray], attention_mask: np.ndarray) -> list[np.ndarray]:
        weights = outputs["sparse_embedding"].astype(np.float32, copy=True)
        weights[:, list(self.config.special_ids)] = 0.0
        return list(weights)

    def finalize(self, prepared: Prepared, reduced: Sequence[Any], options: SparseOptions,
                 encoder) -> list[SparseVector]:
        results = []
        for weights in reduced:
            kept = np.flatnonzero(weights > options.threshold)
            if options.top_k is not None and len(kept) > options.top_k:
                kept = np.sort(kept[np.argsort(-weights[kept], kind="stable")[: options.top_k]])
            results.append(SparseVector(tuple(int(i) for i in kept), tuple(float(weights[i]) for i in kept)))
        return results

    @classmethod
    def agreement(cls, data: AgreementInputs, variant: Run) -> Agreement:
        ref, got = np.stack(data.reference.reduced).astype(np.float64), np.stack(variant.reduced).astype(np.float64)
        norms = np.linalg.norm(ref, axis=1) * np.linalg.norm(got, axis=1)
        # Two empty vectors agree; one empty and one not do not.
        cos = np.where(norms > 0, (ref * got).sum(1) / np.clip(norms, 1e-12, None),
                       (np.abs(ref).sum(1) == np.abs(got).sum(1)).astype(np.float64))
        overlap = [len(set(np.argsort(-a)[:TOP_TERMS]) & set(np.argsort(-b)[:TOP_TERMS])) / TOP_TERMS
                   for a, b in zip(ref, got)]
        figures = {"mean_cosine": float(cos.mean()), "min_cosine": float(cos.min()),
                   f"top{TOP_TERMS}_term_overlap": float(np.mean(overlap)),
                   "mean_terms_reference": float((ref > 0).sum(1).mean()),
                   "mean_terms_variant": float((got > 0).sum(1).mean())}
        return Agreement.of("min_cosine", figures, data.lengths(), cos, "cosine")

    @classmethod
    def floors(cls, agreement: Agreement, tolerance: float) -> list[Floor]:
        return [Floor("min_cosine", agreement.figures["min_cosine"], 1.0 - tolerance),
                Floor("mean_cosine", agreement.figures["mean_cosine"], 1.0 - tolerance / 2)]

    parse_row = FeatureExtraction.parse_row
    eval_inputs = FeatureExtraction.eval_inputs

    @classmethod
    def builtin_eval(cls) -> EvalSet:
        found = FeatureExtraction.builtin_eval()
        return EvalSet(cls.name, found.source, found.inputs, found.labels, builtin=True)

    @classmethod
    def evaluate(cls, predictor, data: EvalSet) -> dict[str, float]:
        """Spearman of the dot product of the two sentences' sparse vectors against the gold similarity."""
        size = predictor.config.dimension
        left = [v.dense(size) for v in predictor.predict([a for a, _ in data.inputs])]
        right = [v.dense(size) for v in predictor.predict([b for _, b in data.inputs])]
        return {"spearman": spearman([float(a @ b) for a, b in zip(left, right)], data.labels)}
