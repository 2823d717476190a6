"""What `kiln audit` found: one Finding per cause it measured, and the AuditResult that audit.json holds.

The same record serves every kind of deployment: ``agreement`` names the per-input figure (cosine for
embeddings, Kendall tau per query for rerankers), and ``figures`` holds the kind's other measurements.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from kiln.records.figures import BucketFigure, bucket_index, bucket_label


@dataclass(frozen=True)
class Finding:
    cause: str  # pooling | normalisation | truncation | prefix | batch drift | activation | pair order
    found: str  # what was measured, in words
    differs: bool  # the deployment differs from the original's configuration here
    figure: float  # the measurement behind it (mean cosine, norm, max |diff|, ...)


@dataclass(frozen=True)
class AuditResult:
    url: str
    protocol: str
    task: str
    model: str
    configured: str  # the original's recipe, in words
    inputs: int  # texts (embeddings) or (query, text) pairs (rerankers) sent
    tolerance: float
    agreement: str  # what min_agreement/mean_agreement measure, in words: "cosine", "kendall tau"
    min_agreement: float  # served against the original as configured
    mean_agreement: float
    floor: float  # the least min_agreement within tolerance
    buckets: tuple[BucketFigure, ...]  # agreement by input length
    findings: tuple[Finding, ...]
    explained_by: tuple[str, ...]  # causes that, applied to the original, bring it within tolerance
    explained_min: float | None  # min_agreement once they are applied
    within_tolerance: bool
    figures: dict[str, float] = field(default_factory=dict)  # the kind's other measurements (top-1 agreement, ...)
    # Which figure is held to the floor: the least (a vector's cosine is continuous) or the mean (a query's tau
    # moves in steps of 2/(n(n-1)): one swapped pair of 8 texts is 0.93, so the gate judges the mean too).
    judged: str = "min"

    def verdict(self) -> str:
        value = self.min_agreement if self.judged == "min" else self.mean_agreement
        other = f"mean {self.mean_agreement:.4f}" if self.judged == "min" else f"min {self.min_agreement:.4f}"
        measured = f"{self.judged} {self.agreement} {value:.4f}"
        bound = self.figures.get("cosine_bound")
        said = "" if bound is None else (f"; a log-normal fit puts 99.9% of texts like these, of each length, at "
                                         f"cosine >= {bound:.4f} (95% confidence)")
        if self.within_tolerance:
            return f"within tolerance: {measured} >= {self.floor:.4f}, {other}{said}"
        once = f" (min {self.agreement} {self.explained_min:.4f} once applied)" \
            if self.explained_min is not None else ""  # normalisation alone leaves every cosine as it was
        why = f"; explained by {', '.join(self.explained_by)}{once}" if self.explained_by else \
            "; no single measured cause explains it"
        where = f"{measured} < {self.floor:.4f}" if value < self.floor else measured
        return f"outside tolerance: {where} ({other}){said}{why}"


def buckets(lengths: Sequence[int], values: np.ndarray) -> tuple[BucketFigure, ...]:
    """``values`` (one per input) by the token-length bucket of each input."""
    index = np.array([bucket_index(n) for n in lengths])
    return tuple(BucketFigure(bucket_label(b), int((index == b).sum()), float(values[index == b].mean()),
                              float(values[index == b].min())) for b in sorted(set(index.tolist())))
