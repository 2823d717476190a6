"""What happened to each variant, and the files that summarise a run (results.json, summary.md)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kiln.records import read_record, write_json
from kiln.records.artifact import Sensitivity, Status, VariantRecord
from kiln.records.batching import BatchedAgreement
from kiln.records.figures import Agreement
from kiln.records.timing import Timing
from kiln.tasks import task_spec

RESULTS_SCHEMA = "kiln.optimize/3"  # 3: each outcome's record is a VariantRecord (2: a plain dict, still read)
READABLE_SCHEMAS = ("kiln.optimize/2", RESULTS_SCHEMA)
RESULTS_FILE = "results.json"


@dataclass(frozen=True)
class Outcome:
    name: str
    status: Status
    reason: str
    record: VariantRecord | None = None  # the built variant's files and recipe (no validation yet)
    agreement: Agreement | None = None
    metric: Mapping[str, float] | None = None
    timing: Timing | None = None
    size_bytes: int = 0
    parameters: Mapping[str, Any] = field(default_factory=dict)  # alternative parameters that were kept
    sensitivity: Sensitivity | None = None
    build_seconds: float = 0.0
    batched: BatchedAgreement | None = None  # agreement per batching and the drift between them

    def recorded(self) -> VariantRecord:
        """The manifest's record of this variant: its files and recipe with how it fared."""
        assert self.record is not None, "only a built variant has a record"
        return dataclasses.replace(self.record, status=self.status, reason=self.reason, agreement=self.agreement,
                                   task_metric=self.metric, timing=self.timing, size_bytes=self.size_bytes,
                                   parameters=self.parameters, sensitivity=self.sensitivity,
                                   batched=self.batched)


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
        """variant | size MB | agreement | batch drift | task metric | ms/seq | speed-up vs PyTorch fp32 | status."""
        base_ms = self.reference_timing.ms_per_sequence
        metric = self.reference_metric.get(self.primary_metric) if self.reference_metric else None
        rows = [[f"pytorch-fp32 ({self.baseline_attention} attention)", "-", "1.0000", "-", _fmt(metric),
                 f"{base_ms:.2f}", "1.00x", "baseline"]]
        for o in self.outcomes:
            agreement = f"{o.agreement.primary} {o.agreement.value:.4f}" if o.agreement else "-"
            if o.batched and o.batched.worst != "sorted":
                agreement += f" ({o.batched.worst})"
            drift = o.batched.drift.describe() if o.batched else "-"
            task_metric = _fmt(o.metric.get(self.primary_metric)) if o.metric and self.primary_metric else "-"
            ms = o.timing.ms_per_sequence if o.timing else None
            status = o.status.value + (" (best)" if o.name == self.best else "")
            rows.append([o.name, f"{o.size_bytes / 1e6:.1f}" if o.size_bytes else "-", agreement, drift, task_metric,
                         f"{ms:.2f}" if ms else "-", f"{base_ms / ms:.2f}x" if ms else "-",
                         status if o.status is Status.ACCEPTED else f"{status}: {o.reason}"])
        return rows


HEADER = ["variant", "size MB", "agreement (worst batching)", "batch drift", "task metric", "ms/seq",
          "speed-up vs PyTorch fp32", "status"]


def _fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.4f}"


def _promise(summary: RunSummary) -> list[str]:
    """What "accepted" promises, in the task's words (none for a task whose gate states nothing beyond its texts)."""
    promise = task_spec(summary.task).validation.promised(summary.tolerance)
    return [f"Accepted means: {promise}.", ""] if promise else []


def markdown(summary: RunSummary) -> str:
    timing = summary.reference_timing
    lines = [f"# kiln optimize: {summary.model} ({summary.task})", "",
             f"Tolerance {summary.tolerance:g}; task metric: {summary.primary_metric or 'none (no labelled data)'}; "
             f"timed on {timing.describe()}, tokenization "
             "excluded.", "", *_promise(summary), f"Calibration: {summary.calibration or 'not recorded'}.", "",
             *([f"Judged and timed against the reference {summary.reference} (the PyTorch fp32 row), not against "
                "the model itself.", ""] if summary.reference else []),
             "| " + " | ".join(HEADER) + " |", "|" + "---|" * len(HEADER)]
    lines += ["| " + " | ".join(cell.replace("|", "/") for cell in row) + " |" for row in summary.rows()]
    lines += ["", f"Best: **{summary.best or 'none'}**", "", f"Command: `{summary.command}`", ""]
    return "\n".join(lines)


def write_stored_vectors(directory: Path, rows: tuple, tolerance: float) -> None:
    """The retrieval cost of each stored (size, precision), appended to summary.md."""
    from kiln.report.html import markdown_table
    from kiln.report.tables import stored_note, stored_vectors_table

    lines = ["## Stored vectors: size x precision", "", *markdown_table(stored_vectors_table(rows, tolerance)),
             stored_note(rows), ""]
    with open(directory / "summary.md", "a") as fh:
        fh.write("\n".join(lines) + "\n")


def write_summaries(directory: Path, summary: RunSummary) -> None:
    write_json(directory / RESULTS_FILE, RESULTS_SCHEMA, summary)
    (directory / "summary.md").write_text(markdown(summary))


def read_results(path: Path) -> RunSummary:
    """A results.json written by `kiln optimize` (refused if it declares a schema this kiln does not read)."""
    return read_record(path, READABLE_SCHEMAS, RunSummary)
