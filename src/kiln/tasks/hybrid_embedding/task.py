"""Hybrid embeddings: BGE-M3's dense vector, lexical (sparse) weights and ColBERT vectors from one forward.

One graph (kiln.model.hybrid) returns the CLS state, a weight per token and a vector per token; the runtime turns
them into what FlagEmbedding's ``BGEM3FlagModel.encode`` returns (FlagEmbedding 1.4.2):

- ``dense``: the CLS state, normalized as the model's sentence-transformers config says (BGE-M3: unit length). It is
  feature extraction's vector, with everything that task offers (Matryoshka ``dimensions``, precisions, chunking,
  prompts, TEI's ``normalize``): a BGE-M3 artifact answers /embed and /v1/embeddings as any embedder;
- ``sparse``: per token id the largest weight of its occurrences, above zero, CLS/EOS/PAD/UNK left out
  (FlagEmbedding's ``lexical_weights``, by vocabulary index);
- ``multi``: the L2-normalised vectors of every real token after CLS (FlagEmbedding's ``colbert_vecs``), scored
  with ColBERT's MaxSim averaged over the query's tokens.

``output`` (``dense`` by default, ``sparse``, ``multi`` or ``all``) chooses what a call returns; the graph computes
all three at once, and the two extra heads cost one hidden x hidden and one hidden x 1 product per token.
Agreement: each output against the original's own (kiln.tasks.hybrid_embedding.validation).
Routes: /embed, /v1/embeddings, /embed_sparse, /embed_multi, /embed_hybrid and TEI's /embed and /embed_sparse.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, fields
from typing import Any

import numpy as np

from kiln.errors import UsageError
from kiln.runtime.features import Prepared
from kiln.runtime.precision import Precision
from kiln.tasks.feature_extraction.task import EmbedOptions, FeatureExtraction, _unit
from kiln.tasks.hybrid_embedding.export import DENSE, TOKEN_VECTORS, TOKEN_WEIGHTS, HybridEmbeddingExport
from kiln.tasks.hybrid_embedding.validation import HybridEmbeddingValidation, lexical_weights
from kiln.tasks.sparse_embedding.task import SparseVector, kept_terms

OUTPUTS = ("dense", "sparse", "multi", "all")


@dataclass(frozen=True)
class HybridReduced:
    """One feature's raw outputs, padding dropped: what validation compares and finalize turns into results."""

    dense: np.ndarray  # the CLS state, not normalized
    ids: np.ndarray  # the feature's token ids (its real positions)
    weights: np.ndarray  # relu(sparse head) per real position
    multi: np.ndarray  # the ColBERT head's vectors of the real positions after CLS, L2-normalised


@dataclass(frozen=True)
class HybridVectors:
    """What ``output="all"`` returns per input (FlagEmbedding's dense_vecs, lexical_weights, colbert_vecs)."""

    dense: np.ndarray
    sparse: SparseVector
    multi: np.ndarray


@dataclass(frozen=True)
class HybridOptions(EmbedOptions):
    output: str = "dense"
    threshold: float = 0.0  # sparse: keep terms whose weight is above this
    top_k: int | None = None  # sparse: then the heaviest k


class HybridEmbedding(FeatureExtraction):
    validation = HybridEmbeddingValidation
    export = HybridEmbeddingExport
    name = "hybrid-embedding"
    decoders = False

    def options(self, output: str = "dense", threshold: float = 0.0, top_k: int | None = None,
                **embed: Any) -> HybridOptions:
        """``output``: dense, sparse, multi or all; ``threshold``/``top_k``: which lexical weights are kept; the rest
        are feature extraction's options, for the dense vector."""
        if output not in OUTPUTS:
            raise UsageError(f"output must be one of {', '.join(OUTPUTS)} (got {output!r})")
        if embed.get("tokens"):
            raise UsageError("tokens: a hybrid model's per-token vectors are its ColBERT vectors: ask for output "
                             "'multi'")
        if threshold < 0:
            raise UsageError(f"threshold must be at least 0 (got {threshold})")
        if top_k is not None and top_k < 1:
            raise UsageError(f"top_k must be at least 1, or None for every term (got {top_k})")
        base = super().options(**embed)
        if output in ("sparse", "multi"):
            dense_only = {"dimensions": base.dimensions is not None, "chunking": base.chunking is not None,
                          "precision": base.precision is not Precision.FLOAT32}
            if given := [name for name, asked in dense_only.items() if asked]:
                raise UsageError(f"{', '.join(given)}: applies to the dense vector; output {output!r} returns "
                                 f"{'lexical weights' if output == 'sparse' else 'ColBERT token vectors'}")
        if output == "all" and base.chunking is not None:
            raise UsageError("chunking: windows are embedded for the dense vector alone; use output 'dense'")
        if output in ("dense", "multi") and (threshold != 0 or top_k is not None):
            raise UsageError(f"threshold and top_k choose lexical weights; output {output!r} has none")
        return HybridOptions(**{f.name: getattr(base, f.name) for f in fields(EmbedOptions)}, output=output,
                             threshold=float(threshold), top_k=top_k)

    def reduce_arrays(self, outputs: dict[str, np.ndarray], arrays: dict[str, np.ndarray]) -> list[HybridReduced]:
        mask = arrays["attention_mask"].astype(bool)
        vectors = outputs[TOKEN_VECTORS].astype(np.float32, copy=False)
        found = []
        for row, real in enumerate(mask):
            multi = vectors[row][real][1:]  # every real token after CLS, as FlagEmbedding keeps them
            multi = multi / np.clip(np.linalg.norm(multi, axis=-1, keepdims=True), 1e-12, None)
            found.append(HybridReduced(outputs[DENSE][row].astype(np.float32), arrays["input_ids"][row][real],
                                       outputs[TOKEN_WEIGHTS][row][real].astype(np.float32), multi))
        return found

    def reduce(self, outputs: dict[str, np.ndarray], attention_mask: np.ndarray) -> list[Any]:
        raise NotImplementedError("hybrid-embedding reduces whole batches (reduce_arrays): it needs the input ids")

    def finalize(self, prepared: Prepared, reduced: Sequence[Any], options: HybridOptions, encoder) -> list[Any]:
        if options.output == "dense":
            return super().finalize(prepared, [r.dense for r in reduced], options, encoder)
        if options.output == "multi":
            return [r.multi for r in reduced]
        sparse = [self.sparse(r, options) for r in reduced]
        if options.output == "sparse":
            return sparse
        dense = super().finalize(prepared, [r.dense for r in reduced], options, encoder)
        return [HybridVectors(d, s, r.multi) for d, s, r in zip(dense, sparse, reduced)]

    def sparse(self, reduced: HybridReduced, options: HybridOptions) -> SparseVector:
        indices, values = lexical_weights(reduced, self.config.special_ids)
        return kept_terms(indices, values, options.threshold, options.top_k)

    def comparable(self, reduced: Any) -> np.ndarray:
        """The three outputs end to end (the dense vector as the model gives it): parity and batch drift see a
        difference in any of them."""
        dense = _unit(reduced.dense) if self.config.normalize else reduced.dense
        return np.concatenate([dense, reduced.weights, reduced.multi.reshape(-1)]).astype(np.float32)
