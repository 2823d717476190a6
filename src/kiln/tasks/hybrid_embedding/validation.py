"""hybrid-embedding's validation part: each of the three outputs against the original's own.

- dense: feature extraction's figures (cosine per text, pairwise similarity Spearman, neighbours kept);
- sparse: cosine of the lexical weights as vocabulary vectors, and the overlap of each text's ten heaviest terms;
- multi: each text's mean cosine of its ColBERT vectors to the original's (the same tokens, in order).

The gate holds each output's least and mean figure (min >= 1 - t, mean >= 1 - t/2); the per-text figure broken
down by length is the least of the three. Task metric: STS Spearman of each output's similarity (dense cosine,
lexical dot product, ColBERT score) and of FlagEmbedding's unweighted combination of the three, so the report shows
the retrieval modes side by side; the dense Spearman is the primary one. With --eval retrieval rows (query, text,
relevance) also NDCG@10 of each mode and of the combination, every query searching every text: the retrieval
table.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from kiln.records.figures import Agreement, AgreementInputs, EvalSet, Floor, Judgements, Run
from kiln.scoring import ndcg_at_k, spearman
from kiln.tasks.feature_extraction.validation import FeatureExtractionValidation

TOP_TERMS = 10
MODES = ("dense", "sparse", "multi")
COMBINED = "dense+sparse+multi"


def lexical_weights(reduced: Any, special_ids: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
    """FlagEmbedding's lexical weights of one text: per token id (ascending) the largest weight of its occurrences,
    those above zero, the model's special ids left out."""
    keep = (reduced.weights > 0) & ~np.isin(reduced.ids, special_ids)
    ids, weights = reduced.ids[keep], reduced.weights[keep]
    indices = np.unique(ids)
    values = np.zeros(len(indices), dtype=np.float32)
    np.maximum.at(values, np.searchsorted(indices, ids), weights)
    return indices, values


def lexical_score(a: tuple[np.ndarray, np.ndarray], b: tuple[np.ndarray, np.ndarray]) -> float:
    """FlagEmbedding's lexical matching score: the dot product over the ids both texts weight."""
    _, left, right = np.intersect1d(a[0], b[0], assume_unique=True, return_indices=True)
    return float(np.dot(a[1][left].astype(np.float64), b[1][right]))


def colbert_score(query: np.ndarray, document: np.ndarray) -> float:
    """FlagEmbedding's ColBERT score: each query vector's best dot product in the document, averaged."""
    return float((query @ document.T).max(axis=1).mean()) if len(query) and len(document) else 0.0


def similarities(a: Any, b: Any) -> dict[str, float]:
    """The similarity of two texts' outputs (HybridVectors) by each: dense cosine, lexical matching score, ColBERT
    score, and their unweighted mean (FlagEmbedding's compute_score with its default weights)."""
    def lexical(vector: Any) -> tuple[np.ndarray, np.ndarray]:
        return np.asarray(vector.indices, dtype=np.int64), np.asarray(vector.values, dtype=np.float32)

    found = {"dense": float(a.dense @ b.dense) / max(float(np.linalg.norm(a.dense) * np.linalg.norm(b.dense)), 1e-12),
             "sparse": lexical_score(lexical(a.sparse), lexical(b.sparse)), "multi": colbert_score(a.multi, b.multi)}
    return found | {COMBINED: float(np.mean([found[mode] for mode in MODES]))}


def _sparse_cosine(a: tuple[np.ndarray, np.ndarray], b: tuple[np.ndarray, np.ndarray]) -> float:
    norms = float(np.linalg.norm(a[1])) * float(np.linalg.norm(b[1]))
    if norms == 0:  # two texts without a weighted term agree; one with and one without do not
        return float(len(a[0]) == len(b[0]))
    return lexical_score(a, b) / norms


def _top_overlap(a: tuple[np.ndarray, np.ndarray], b: tuple[np.ndarray, np.ndarray]) -> float:
    top = [set(ids[np.argsort(-values, kind="stable")[:TOP_TERMS]].tolist()) for ids, values in (a, b)]
    return len(top[0] & top[1]) / max(len(top[0] | top[1]), 1) if any(top) else 1.0


class HybridEmbeddingValidation(FeatureExtractionValidation):
    name = "hybrid-embedding"
    tolerance_help = ("for the dense vector, the lexical weights and the ColBERT vectors each: min cosine >= 1-t "
                      "and mean cosine >= 1-t/2")

    @classmethod
    def agreement(cls, data: AgreementInputs, variant: Run) -> Agreement:
        dense = super().agreement(data, variant)
        special = data.config.special_ids if data.config else ()
        pairs = list(zip(data.reference.reduced, variant.reduced))
        lexical = [(lexical_weights(a, special), lexical_weights(b, special)) for a, b in pairs]
        sparse = np.array([_sparse_cosine(a, b) for a, b in lexical])
        multi = np.array([float((a.multi * b.multi).sum(axis=1).mean()) if len(a.multi) else 1.0 for a, b in pairs])
        dense_cos = cls._dense_cosines(data, variant)
        figures = {f"dense_{name}": value for name, value in dense.figures.items()} | {
            "sparse_mean_cosine": float(sparse.mean()), "sparse_min_cosine": float(sparse.min()),
            f"sparse_top{TOP_TERMS}_term_overlap": float(np.mean([_top_overlap(a, b) for a, b in lexical])),
            "multi_mean_cosine": float(multi.mean()), "multi_min_cosine": float(multi.min())}
        least = np.minimum(np.minimum(dense_cos, sparse), multi)
        figures["min_cosine"] = float(least.min())
        return Agreement.of("min_cosine", figures, data.lengths(), least, "least cosine of dense, sparse, multi")

    @staticmethod
    def _dense_cosines(data: AgreementInputs, variant: Run) -> np.ndarray:
        ref, got = (np.stack(run.results).astype(np.float64) for run in (data.reference, variant))
        ref /= np.clip(np.linalg.norm(ref, axis=1, keepdims=True), 1e-12, None)
        got /= np.clip(np.linalg.norm(got, axis=1, keepdims=True), 1e-12, None)
        return (ref * got).sum(axis=1)

    @classmethod
    def floors(cls, agreement: Agreement, tolerance: float) -> list[Floor]:
        figures = agreement.figures
        return [Floor(f"{mode}_{stat}_cosine", figures[f"{mode}_{stat}_cosine"], floor) for mode in MODES
                for stat, floor in (("min", 1.0 - tolerance), ("mean", 1.0 - tolerance / 2))]

    @classmethod
    def evaluate(cls, predictor: Any, data: EvalSet) -> dict[str, float]:
        """Spearman of each output's similarity against the gold scores, and of their unweighted mean (what
        FlagEmbedding's compute_score calls colbert+sparse+dense)."""
        left = predictor.predict([a for a, _ in data.inputs], output="all")
        right = predictor.predict([b for _, b in data.inputs], output="all")
        rows = [similarities(a, b) for a, b in zip(left, right)]
        found = {f"spearman{'' if mode == 'dense' else '_' + mode}": spearman([r[mode] for r in rows], data.labels)
                 for mode in (*MODES, COMBINED)}
        judgements = cls.retrieval_judgements(data)
        return found if judgements is None else found | cls._retrieval(predictor, judgements)

    @staticmethod
    def _retrieval(predictor: Any, judgements: Judgements) -> dict[str, float]:
        """The retrieval table: each query of the user's rows searches every text, ranked by each output's score and
        by their unweighted mean; NDCG@10 (graded gains) of each ranking, averaged over the queries."""
        queries = predictor.predict(judgements.queries, output="all")
        documents = predictor.predict(judgements.documents, output="all")
        table = [[similarities(q, d) for d in documents] for q in queries]
        return {f"ndcg@10_{mode}": float(np.mean([ndcg_at_k([s[mode] for s in row], relevance)
                                                  for row, relevance in zip(table, judgements.relevance)]))
                for mode in (*MODES, COMBINED)}
