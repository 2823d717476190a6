"""frontier.html / .md / .json: every variant of a model and of its students, speed against fidelity.

Each point is one variant of one model (the model itself or a student of kiln optimize --distill-layers /
--prune), judged against the model itself and timed against its PyTorch fp32 in the same run. The Pareto points
(nothing else both faster and more faithful) are named on the chart: what each step buys, and what it costs.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from html import escape
from pathlib import Path
from typing import Any

from kiln.report import svg
from kiln.report.html import CSS

FILES = ("frontier.html", "frontier.md", "frontier.json")


@dataclass(frozen=True)
class Point:
    model: str  # "model" for the model itself, else the student's name
    variant: str
    parameters: int | None
    speedup: float | None  # vs the model's PyTorch fp32, timed in the same run; None: not timed (rejected)
    agreement: float | None  # the gate's figure, against the model itself
    status: str
    reason: str

    @property
    def label(self) -> str:
        return f"{self.model} / {self.variant}"


def points(model: str, summary: Any, parameters: int | None, figure: str | None = None) -> list[Point]:
    """The points of one kiln optimize run (a RunSummary), placed by the gate's figure or, given ``figure``, by
    that one (a figure every point has, when their gates judge different ones)."""
    base = summary.reference_timing.ms_per_sequence
    out = []
    for o in summary.outcomes:
        if o.agreement is None:
            continue
        speedup = base / o.timing.ms_per_sequence if o.timing else None
        value = o.agreement.figures[figure] if figure else o.agreement.value
        out.append(Point(model, o.name, parameters, speedup, value, o.status.value, o.reason))
    return out


def pareto(all_points: list[Point]) -> list[Point]:
    """Timed points that no other timed point beats on both speed and agreement."""
    timed = [p for p in all_points if p.speedup is not None and p.agreement is not None]
    return [p for p in timed if not any(q.speedup >= p.speedup and q.agreement >= p.agreement and
                                        (q.speedup > p.speedup or q.agreement > p.agreement) for q in timed)]


def _rows(all_points: list[Point], front: list[Point]) -> tuple[list[str], list[list[str]]]:
    header = ["model", "variant", "parameters", "speed-up", "agreement", "status", "on the frontier"]
    rows = []
    for p in sorted(all_points, key=lambda p: -(p.speedup or 0)):
        rows.append([p.model, p.variant, f"{p.parameters / 1e6:.3g}M" if p.parameters else "-",
                     f"{p.speedup:.2f}x" if p.speedup is not None else "-",
                     f"{p.agreement:.4f}" if p.agreement is not None else "-",
                     p.status if p.status != "rejected" else f"rejected: {p.reason}", "yes" if p in front else ""])
    return header, rows


def write_frontier(directory: Path, all_points: list[Point], *, model: str, tolerance: float, primary: str,
                   command: str, notes: list[str]) -> None:
    """The three frontier files in ``directory``, each written atomically."""
    front = pareto(all_points)
    gate = 1 - tolerance
    title = f"kiln: speed-fidelity frontier of {model} and its students"
    groups: dict[str, list[tuple[float, float, bool, str]]] = {}
    for p in all_points:
        if p.agreement is not None:
            groups.setdefault(p.model, []).append((p.speedup or 0.0, p.agreement, p.status == "accepted", p.variant))
    chart = svg.frontier_chart(groups, [(p.speedup, p.agreement) for p in front],
                               title="speed vs fidelity, every variant of every model",
                               x_label="speed-up vs the model's PyTorch fp32 (0: not timed)",
                               y_label=f"{primary} against the model", threshold=gate,
                               threshold_label=f"gate {gate:g}; filled: accepted, hollow: rejected")
    header, rows = _rows(all_points, front)
    explain = (f"Every variant is judged against {model} itself ({primary}; gate {gate:g}) and timed against "
               "its PyTorch fp32 in the same run. Named points are the frontier: nothing else is both faster and "
               "more faithful.")
    html_rows = "".join("<tr>" + "".join(f"<td>{escape(c)}</td>" for c in row) + "</tr>" for row in rows)
    page = (f"<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\"><title>{escape(title)}</title>"
            f"<style>{CSS}</style></head><body><h1>{escape(title)}</h1><p>Command: <code>{escape(command)}</code>"
            f"</p><p>{escape(explain)}</p><div class=\"charts\">{chart}</div><h2>Every variant</h2><table><tr>"
            + "".join(f"<th>{escape(h)}</th>" for h in header) + f"</tr>{html_rows}</table>"
            + "".join(f"<p>{escape(n)}</p>" for n in notes) + "</body></html>\n")
    md = [f"# {title}", "", f"Command: `{command}`", "", explain, "", "| " + " | ".join(header) + " |",
          "|" + "---|" * len(header), *["| " + " | ".join(c.replace("|", "/") for c in r) + " |" for r in rows],
          "", *[f"{n}\n" for n in notes]]
    data = {"model": model, "tolerance": tolerance, "primary": primary, "command": command,
            "points": [asdict(p) for p in all_points], "frontier": [p.label for p in front], "notes": notes}
    for name, text in zip(FILES, (page, "\n".join(md) + "\n", json.dumps(data, indent=2) + "\n"), strict=True):
        tmp = directory / (name + ".tmp")
        tmp.write_text(text, encoding="utf-8")
        tmp.replace(directory / name)
