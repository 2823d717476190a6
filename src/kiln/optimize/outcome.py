"""What happened to each variant, and the files that summarise a run (results.json, summary.md)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any

from kiln.bench.measure import Timing
from kiln.records import read_record, to_jsonable, write_json
from kiln.validation.figures import Agreement

RESULTS_SCHEMA = "kiln.optimize/2"
RESULTS_FILE = "results.json"


class Status(str, Enum):
    ACCEPTED = "accepted"  # built, validated, within tolerance
    REJECTED = "rejected"  # built and validated, outside tolerance
    SKIPPED = "skipped"  # cannot be built here (missing package, CPU feature)
    FAILED = "failed"  # a pass or its validation raised


@dataclass(frozen=True)
class Round:
    """One attempt of the exclusion search: how many layers were kept in fp32, and the result."""

    excluded: int
    agreement: float
    accepted: bool


@dataclass(frozen=True)
class Sensitivity:
    """The int8 exclusion search of one variant: the ranking it used and what it found."""

    ranking: tuple[tuple[str, float], ...]  # (layer, relative int8 error), worst first (top 10)
    rounds: tuple[Round, ...]
    excluded: tuple[str, ...]  # layers kept in fp32 in the final variant
    accepted: bool
    speed_cost: float | None = None  # time with the exclusions / time fully quantized (> 1: slower)


@dataclass(frozen=True)
class Outcome:
    name: str
    status: Status
    reason: str
    record: Mapping[str, Any] | None = None  # the built variant's manifest record
    agreement: Agreement | None = None
    metric: Mapping[str, float] | None = None
    timing: Timing | None = None
    size_bytes: int = 0
    parameters: Mapping[str, Any] = field(default_factory=dict)  # alternative parameters that were kept
    sensitivity: Sensitivity | None = None
    build_seconds: float = 0.0

    def validation(self) -> dict[str, Any]:
        """What the manifest records about this variant beside its files and recipe."""
        return to_jsonable({"status": self.status, "reason": self.reason, "agreement": self.agreement,
                            "task_metric": self.metric, "timing": self.timing, "size_bytes": self.size_bytes,
                            "parameters": self.parameters, "sensitivity": self.sensitivity})


@dataclass(frozen=True)
class RunSummary:
    model: str
    task: str
    tolerance: float
    primary_metric: str | None
    reference_metric: Mapping[str, float] | None
    reference_timing: Timing
    outcomes: tuple[Outcome, ...]
    best: str | None
    command: str
    baseline_attention: str = "eager"  # attention implementation the PyTorch baseline was timed with
    calibration: str = ""  # where the int8 calibration inputs came from
    reference: str = ""  # the original the variants were judged and timed against, when not the model itself
    environment: Mapping[str, Any] = field(default_factory=dict)

    def rows(self) -> list[list[str]]:
        """variant | size MB | agreement | task metric | ms/seq | speed-up vs PyTorch fp32 | status."""
        base_ms = self.reference_timing.ms_per_sequence
        metric = self.reference_metric.get(self.primary_metric) if self.reference_metric else None
        rows = [[f"pytorch-fp32 ({self.baseline_attention} attention)", "-", "1.0000", _fmt(metric),
                 f"{base_ms:.2f}", "1.00x", "baseline"]]
        for o in self.outcomes:
            agreement = f"{o.agreement.primary} {o.agreement.value:.4f}" if o.agreement else "-"
            task_metric = _fmt(o.metric.get(self.primary_metric)) if o.metric and self.primary_metric else "-"
            ms = o.timing.ms_per_sequence if o.timing else None
            status = o.status.value + (" (best)" if o.name == self.best else "")
            rows.append([o.name, f"{o.size_bytes / 1e6:.1f}" if o.size_bytes else "-", agreement, task_metric,
                         f"{ms:.2f}" if ms else "-", f"{base_ms / ms:.2f}x" if ms else "-",
                         status if o.status is Status.ACCEPTED else f"{status}: {o.reason}"])
        return rows


HEADER = ["variant", "size MB", "agreement", "task metric", "ms/seq", "speed-up vs PyTorch fp32", "status"]


def _fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.4f}"


def markdown(summary: RunSummary) -> str:
    timing = summary.reference_timing
    lines = [f"# kiln optimize: {summary.model} ({summary.task})", "",
             f"Tolerance {summary.tolerance:g}; task metric: {summary.primary_metric or 'none (no labelled data)'}; "
             f"timed on {timing.sequences} sequences, length-sorted batches of {timing.batch_size}, tokenization "
             "excluded.", "", f"Calibration: {summary.calibration or 'not recorded'}.", "",
             *([f"Judged and timed against the reference {summary.reference} (the PyTorch fp32 row), not against "
                "the model itself.", ""] if summary.reference else []),
             "| " + " | ".join(HEADER) + " |", "|" + "---|" * len(HEADER)]
    lines += ["| " + " | ".join(cell.replace("|", "/") for cell in row) + " |" for row in summary.rows()]
    lines += ["", f"Best: **{summary.best or 'none'}**", "", f"Command: `{summary.command}`", ""]
    return "\n".join(lines)


def write_summaries(directory: Path, summary: RunSummary) -> None:
    write_json(directory / RESULTS_FILE, RESULTS_SCHEMA, summary)
    (directory / "summary.md").write_text(markdown(summary))


def read_results(path: Path) -> RunSummary:
    """A results.json written by `kiln optimize` (refused if it declares another schema)."""
    return read_record(path, RESULTS_SCHEMA, RunSummary)
