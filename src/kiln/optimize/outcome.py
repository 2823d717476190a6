"""What happened to each variant, and the files that summarise a run (results.json, summary.md)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

STATUSES = ("accepted", "rejected", "skipped", "failed")


@dataclass
class Outcome:
    name: str
    status: str  # one of STATUSES
    reason: str
    record: dict[str, Any] | None = None  # the built variant's manifest record
    agreement: dict[str, Any] | None = None
    metric: dict[str, float] | None = None
    timing: dict[str, Any] | None = None
    size_bytes: int = 0
    sensitivity: dict[str, Any] | None = None
    build_seconds: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items()}


@dataclass
class RunSummary:
    model: str
    task: str
    tolerance: float
    primary_metric: str | None
    reference_metric: dict[str, float] | None
    reference_timing: dict[str, Any]
    outcomes: list[Outcome]
    best: str | None
    command: str
    baseline_attention: str = "eager"  # attention implementation the PyTorch baseline was timed with
    environment: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        raw = dict(self.__dict__)
        raw["outcomes"] = [o.to_dict() for o in self.outcomes]
        return raw

    def rows(self) -> list[list[str]]:
        """variant | size MB | agreement | task metric | ms/seq | speed-up vs PyTorch fp32 | status."""
        base_ms = self.reference_timing["ms_per_sequence"]
        metric = self.reference_metric.get(self.primary_metric) if self.reference_metric else None
        rows = [[f"pytorch-fp32 ({self.baseline_attention} attention)", "-", "1.0000", _fmt(metric),
                 f"{base_ms:.2f}", "1.00x", "baseline"]]
        for o in self.outcomes:
            agreement = f"{o.agreement['primary']} {o.agreement['value']:.4f}" if o.agreement else "-"
            task_metric = _fmt(o.metric.get(self.primary_metric)) if o.metric and self.primary_metric else "-"
            ms = o.timing["ms_per_sequence"] if o.timing else None
            status = o.status + (" (best)" if o.name == self.best else "")
            rows.append([o.name, f"{o.size_bytes / 1e6:.1f}" if o.size_bytes else "-", agreement, task_metric,
                         f"{ms:.2f}" if ms else "-", f"{base_ms / ms:.2f}x" if ms else "-",
                         status if o.status == "accepted" else f"{status}: {o.reason}"])
        return rows


HEADER = ["variant", "size MB", "agreement", "task metric", "ms/seq", "speed-up vs PyTorch fp32", "status"]


def _fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.4f}"


def markdown(summary: RunSummary) -> str:
    lines = [f"# kiln optimize: {summary.model} ({summary.task})", "",
             f"Tolerance {summary.tolerance:g}; task metric: {summary.primary_metric or 'none (no labelled data)'}; "
             f"timed on {summary.reference_timing['sequences']} sequences, length-sorted batches of "
             f"{summary.reference_timing['batch_size']}, tokenization excluded.", "",
             "| " + " | ".join(HEADER) + " |", "|" + "---|" * len(HEADER)]
    lines += ["| " + " | ".join(cell.replace("|", "/") for cell in row) + " |" for row in summary.rows()]
    lines += ["", f"Best: **{summary.best or 'none'}**", "", f"Command: `{summary.command}`", ""]
    return "\n".join(lines)


def write_summaries(directory: Path, summary: RunSummary) -> None:
    (directory / "results.json").write_text(json.dumps(summary.to_dict(), indent=2, default=str) + "\n")
    (directory / "summary.md").write_text(markdown(summary))
