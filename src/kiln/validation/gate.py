"""The gate: which variants are close enough to the original to ship."""

from __future__ import annotations

import math
from dataclasses import dataclass

from kiln.errors import UsageError
from kiln.records.batching import BatchDrift
from kiln.records.figures import Agreement
from kiln.tasks import task_spec


@dataclass(frozen=True)
class Verdict:
    accepted: bool
    reason: str


def tolerance_for(task: str, tolerance: float | None) -> float:
    """The user's --tolerance, checked, or the task's default."""
    if tolerance is None:
        return task_spec(task).validation.default_tolerance
    if not 0 < tolerance < 1:
        raise UsageError(f"tolerance must be between 0 and 1 (got {tolerance:g})")
    return tolerance


def judge_drift(verdict: Verdict, drift: BatchDrift, tolerance: float) -> Verdict:
    """An accepted verdict stands only if the same input's answer moves less than the tolerance between batchings:
    a variant within tolerance of the original in every batching can still differ from itself by twice as much
    (alone a little one way, batched the other), and a server would give both answers."""
    floor = 1 - tolerance
    if verdict.accepted and drift.consistency < floor:
        return Verdict(False, f"batch drift: {drift.figure} {drift.consistency:.4f} between batchings of the same "
                       f"inputs < {floor:.4f}")
    return verdict


def judge(task: str, agreement: Agreement, tolerance: float,
          metric: float | None = None, reference_metric: float | None = None) -> Verdict:
    """Accept when every floor the task sets and (if measured) the task metric are within tolerance."""
    # Enough decimals that a floor of 0.999999 never prints as 1.0000.
    digits = max(4, math.ceil(-math.log10(tolerance / 2)) + 1)

    def f(x: float) -> str:
        return f"{x:.{digits}f}"

    floors = task_spec(task).validation.floors(agreement, tolerance)
    for floor in floors:
        if not floor.met:
            return Verdict(False, f"{floor.figure} {f(floor.value)} < {f(floor.floor)}")
    judge = task_spec(task).validation
    loss = judge.metric_loss(metric, reference_metric) if metric is not None and reference_metric is not None else 0.0
    if loss > tolerance:
        if judge.metric_higher_is_better:
            return Verdict(False, f"task metric {f(metric)} is {f(loss)} below the original's "
                           f"{f(reference_metric)} (allowed {tolerance:g})")
        return Verdict(False, f"{judge.metric} {f(metric)} is {loss:.2%} above the original's {f(reference_metric)} "
                       f"(allowed {tolerance:.0%})")
    said = [floors[0], *(floor for floor in floors[1:] if floor.stated)]
    return Verdict(True, ", ".join(f"{floor.figure} {f(floor.value)} >= {f(floor.floor)}" for floor in said))
