"""sparse-embedding's validation part: cosine of the sparse vectors and top-term overlap; STS Spearman as the
task metric."""

from __future__ import annotations

import numpy as np

from kiln.records.figures import Agreement, AgreementInputs, EvalSet, Floor, Run
from kiln.scoring import spearman
from kiln.tasks.feature_extraction.validation import FeatureExtractionValidation
from kiln.tasks.validation import TaskValidation

TOP_TERMS = 10  # agreement's term overlap


class SparseEmbeddingValidation(TaskValidation):
    name = "sparse-embedding"
    default_tolerance = 0.02
    tolerance_help = f"min cosine >= 1-t and mean cosine >= 1-t/2 (top-{TOP_TERMS} term overlap reported)"
    metric = "spearman"
    eval_fields = FeatureExtractionValidation.eval_fields
    has_builtin_eval = True

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

    parse_row = FeatureExtractionValidation.parse_row
    eval_inputs = FeatureExtractionValidation.eval_inputs

    @classmethod
    def builtin_eval(cls) -> EvalSet:
        found = FeatureExtractionValidation.builtin_eval()
        return EvalSet(cls.name, found.source, found.inputs, found.labels, builtin=True)

    @classmethod
    def evaluate(cls, predictor, data: EvalSet) -> dict[str, float]:
        """Spearman of the dot product of the two sentences' sparse vectors against the gold similarity."""
        size = predictor.config.dimension
        left = [v.dense(size) for v in predictor.predict([a for a, _ in data.inputs])]
        right = [v.dense(size) for v in predictor.predict([b for _, b in data.inputs])]
        return {"spearman": spearman([float(a @ b) for a, b in zip(left, right)], data.labels)}
