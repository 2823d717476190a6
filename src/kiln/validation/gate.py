"""The gate: which variants are close enough to the original to ship."""

from __future__ import annotations

import math
from dataclasses import dataclass

from kiln.choices import TaskName
from kiln.errors import UsageError
from kiln.validation.agreement import Agreement

# Default --tolerance per task: the largest drop allowed in the agreement figure below 1.0 and, with
# --eval, in the task metric below the original's. Each value is documented in `kiln optimize --help`.
DEFAULT_TOLERANCE: dict[TaskName, float] = {
    TaskName.FEATURE_EXTRACTION: 0.01,  # min cosine >= 0.99 and mean cosine >= 0.995
    TaskName.TEXT_CLASSIFICATION: 0.01,  # >= 99% same top label; accuracy within 1 point
    TaskName.TOKEN_CLASSIFICATION: 0.01,  # >= 99% same tag per token; entity F1 within 1 point
    TaskName.QUESTION_ANSWERING: 0.02,  # answer F1 vs the original >= 0.98; SQuAD F1 within 2 points
}


@dataclass(frozen=True)
class Verdict:
    accepted: bool
    reason: str


def tolerance_for(task: TaskName, tolerance: float | None) -> float:
    if tolerance is None:
        return DEFAULT_TOLERANCE[task]
    if not 0 < tolerance < 1:
        raise UsageError(f"--tolerance must be between 0 and 1 (got {tolerance:g})")
    return tolerance


def judge(task: TaskName, agreement: Agreement, tolerance: float,
          metric: float | None = None, reference_metric: float | None = None) -> Verdict:
    """Accept when agreement and (if measured) the task metric are within tolerance; say why if not."""
    # Enough decimals that a floor of 0.999999 never prints as 1.0000.
    digits = max(4, math.ceil(-math.log10(tolerance / 2)) + 1)

    def f(x: float) -> str:
        return f"{x:.{digits}f}"

    floor = 1.0 - tolerance
    if agreement.value < floor:
        return Verdict(False, f"{agreement.primary} {f(agreement.value)} < {f(floor)}")
    if task is TaskName.FEATURE_EXTRACTION:
        mean, mean_floor = agreement.figures["mean_cosine"], 1.0 - tolerance / 2
        if mean < mean_floor:
            return Verdict(False, f"mean_cosine {f(mean)} < {f(mean_floor)}")
    if metric is not None and reference_metric is not None and reference_metric - metric > tolerance:
        return Verdict(False, f"task metric {f(metric)} is {f(reference_metric - metric)} below the original's "
                       f"{f(reference_metric)} (allowed {tolerance:g})")
    return Verdict(True, f"{agreement.primary} {f(agreement.value)} >= {f(floor)}")
