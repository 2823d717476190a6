"""report.html: one self-contained page (inline CSS and SVG; no scripts, fonts or network) + report.md."""

from __future__ import annotations

import json
from html import escape
from pathlib import Path

from kiln.records import to_jsonable
from kiln.records.artifact import Status
from kiln.records.bench import BenchResults
from kiln.records.timing import describe_timing
from kiln.report import svg, tables

CSS = """
body{font-family:sans-serif;margin:24px auto;max-width:1180px;color:#222;background:#fafafa}
h1{font-size:22px}h2{font-size:18px;margin-top:28px;border-bottom:1px solid #ddd}
table{border-collapse:collapse;margin:8px 0;font-size:13px;background:#fff}
th,td{border:1px solid #ccc;padding:4px 8px;text-align:right}th{background:#f0f0f0}
td:first-child,th:first-child{text-align:left}.bad{color:#b00}.good{color:#070}
.charts{display:flex;flex-wrap:wrap;gap:12px}.charts svg{border:1px solid #ddd;background:#fff}
pre{background:#fff;border:1px solid #ddd;padding:8px;font-size:12px;overflow-x:auto}
"""

GENERATION_TITLE = "Generation: time to first token / per-token latency, ms (batch x prompt tokens)"
GENERATION_SPEEDUP_TITLE = "Generation: speed-up over PyTorch fp32 (first token / per token)"


def html_table(table: tables.Table | None) -> str:
    if table is None or not table[1]:
        return ""
    header, rows = table
    head = "".join(f"<th>{escape(h)}</th>" for h in header)
    body = []
    for row in rows:
        cells = []
        for cell in row:
            cls = ' class="bad"' if cell.startswith(("rejected", "failed", "skipped")) else \
                ' class="good"' if cell.startswith("accepted") else ""
            cells.append(f"<td{cls}>{escape(cell)}</td>")
        body.append("<tr>" + "".join(cells) + "</tr>")
    return f"<table><tr>{head}</tr>{''.join(body)}</table>"


def _charts(data: BenchResults) -> list[str]:
    charts = []
    targets = [t for t in data.targets if not t.error and t.grid]
    for t in targets:
        by_len: dict[str, list[tuple[float, float]]] = {}
        for c in t.grid:
            by_len.setdefault(f"{c.seq_len} tokens", []).append((c.batch_size, c.ms_per_sequence))
        charts.append(svg.line_chart(by_len, title=f"{t.name}: latency per sequence vs batch size",
                                     x_label="batch size", y_label="ms per sequence"))
    b1 = {t.name: [(c.seq_len, c.median_ms) for c in t.grid if c.batch_size == 1] for t in targets}
    if any(b1.values()):
        charts.append(svg.line_chart(b1, title="batch-1 latency vs sequence length", x_label="tokens",
                                     y_label="ms (median)"))
    mixes = {t.name: {"sorted": t.mix.sorted_per_s, "unsorted": t.mix.unsorted_per_s} for t in targets if t.mix}
    if mixes:
        charts.append(svg.bar_chart(mixes, title="throughput on the length mix", y_label="sequences / s"))
    opt = data.optimize
    if opt and opt.reference_timing:
        base = opt.reference_timing.ms_per_sequence
        points = {}
        for name, v in opt.variants.items():
            ms = v.timing.ms_per_sequence if v.timing else None
            if v.agreement is not None:
                points[name] = (base / ms if ms else 0.0, v.agreement.value, v.status is Status.ACCEPTED)
        tolerance = opt.tolerance
        charts.append(svg.scatter(points, title="speed vs fidelity (green: accepted)",
                                  x_label="speed-up vs PyTorch fp32 (0: not timed)",
                                  y_label="agreement (primary figure)",
                                  threshold=1 - tolerance if tolerance is not None else None,
                                  threshold_label=f"gate: {1 - tolerance:g} (tolerance {tolerance:g})"
                                  if tolerance is not None else "",
                                  labelled=[n for n, (_, _, ok) in points.items() if not ok or n == opt.best]))
    return charts


def _generation_charts(data: BenchResults) -> list[str]:
    """Per batch size: time to first token, and per-token latency, against prompt length, one line per target."""
    targets = [t for t in data.targets if not t.error and t.generation]
    charts = []
    for batch in sorted({c.batch_size for t in targets for c in t.generation}):
        for key, what in (("ttft_ms", "time to first token"), ("per_token_ms", "per-token latency")):
            series = {t.name: [(c.prompt_tokens, getattr(c, key)) for c in t.generation if c.batch_size == batch]
                      for t in targets}
            charts.append(svg.line_chart(series, title=f"batch {batch}: {what} vs prompt length",
                                         x_label="prompt tokens", y_label="ms (median)"))
    return charts


def _notes(data: BenchResults) -> list[tuple[str, str]]:
    """(label, text) sentences under the variants table."""
    opt = data.optimize
    notes = []
    if invariant := tables.invariant_sentence(data):
        notes.append(("Batching:", f"{invariant} {tables.DRIFT_NOTE}"))
    if opt and opt.calibration:
        notes.append(("Calibration:", f"{opt.calibration}."))
    if opt and (ref := opt.reference_timing):
        timed = describe_timing(ref.sequences, ref.batch_size, ref.new_tokens)
        notes.append(("ms/seq:", f"kiln optimize's timing on {timed}, tokenization excluded."))
    if opt and opt.reference:
        notes.append(("Judged and timed against:", f"{opt.reference} (the reference, PyTorch fp32), not the model "
                                                   "itself."))
    return notes


def render(data: BenchResults) -> str:
    title = f"kiln report: {data.model} ({data.task})"
    parts = [f"<h1>{escape(title)}</h1>",
             f"<p>Created {escape(data.created)}. Command: <code>{escape(data.command)}</code></p>"]
    summary = tables.summary(data)
    if summary[1]:
        parts += ["<h2>Variants</h2>", html_table(summary)]
        parts += [f"<p><strong>{escape(label)}</strong> {escape(text)}</p>" for label, text in _notes(data)]
    stored = tables.stored_vectors_table(data.optimize.stored_vectors, data.optimize.retrieval_tolerance) \
        if data.optimize else None
    if stored:
        parts += ["<h2>Stored vectors: size x precision</h2>", html_table(stored),
                  f"<p>{escape(tables.stored_note(data.optimize.stored_vectors))}</p>"]
    if data.targets:
        parts += [f"<h2>{tables.targets_title(data)}</h2>", html_table(tables.targets_table(data))]
    generation = tables.generation_table(data)
    if generation:
        parts += [f"<h2>{GENERATION_TITLE}</h2>", html_table(generation),
                  f"<p>{escape(tables.generation_note(data))}</p>"]
        if kernels := data.environment.get("int8_kernels"):
            parts.append(f"<p><strong>int8 kernels on this CPU:</strong> {escape(kernels)}.</p>")
        speedup = tables.generation_speedup(data)
        if speedup:
            parts += [f"<h3>{GENERATION_SPEEDUP_TITLE}</h3>", html_table(speedup)]
        parts += ['<div class="charts">', *_generation_charts(data), "</div>"]
    charts = _charts(data)
    if charts:
        parts += ["<h2>Charts</h2>", '<div class="charts">', *charts, "</div>"]
    for t in data.targets:
        if t.error or not t.grid:
            continue
        parts += [f"<h2>{escape(t.name)}: ms per sequence (batch size x tokens)</h2>",
                  html_table(tables.latency_grid(data, t.name))]
        speedup = tables.speedup_grid(data, t.name)
        if speedup:
            parts += [f"<h3>{escape(t.name)}: speed-up over PyTorch fp32</h3>", html_table(speedup)]
    gemm = tables.gemm_table(data)
    if gemm:
        parts += ["<h2>GEMM bound at 128 tokens</h2>", html_table(gemm), f"<p>{escape(tables.GEMM_NOTE)}</p>"]
    sweep = tables.sweep_table(data)
    if sweep:
        parts += ["<h2>Thread sweep</h2>", html_table(sweep)]
        if data.serving_default:
            parts.append(f"<p>{escape(tables.serving_sentence(data.serving_default))}</p>")
    parts += ["<h2>Environment</h2>", f"<pre>{escape(json.dumps(to_jsonable(data.environment), indent=2))}</pre>"]
    return page(title, parts)


def page(title: str, parts: list[str]) -> str:
    """A self-contained page: ``parts`` (HTML) under the report's style."""
    return (f"<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\"><title>{escape(title)}</title>"
            f"<style>{CSS}</style></head><body>{''.join(parts)}</body></html>\n")


def markdown_table(table: tables.Table | None) -> list[str]:
    """A Markdown table's lines (and a blank one), none for an empty table; a ``|`` in a cell becomes ``/``."""
    if table is None or not table[1]:
        return []
    header, rows = table
    return ["| " + " | ".join(header) + " |", "|" + "---|" * len(header),
            *["| " + " | ".join(c.replace("|", "/") for c in row) + " |" for row in rows], ""]


def markdown(data: BenchResults) -> str:
    md = markdown_table
    lines = [f"# kiln report: {data.model} ({data.task})", "", f"Command: `{data.command}`", ""]
    lines += md(tables.summary(data))
    for label, text in _notes(data):
        lines += [f"**{label}** {text}", ""]
    stored = md(tables.stored_vectors_table(data.optimize.stored_vectors, data.optimize.retrieval_tolerance)
                if data.optimize else None)
    if stored:
        lines += ["## Stored vectors: size x precision", "", *stored, tables.stored_note(data.optimize.stored_vectors),
                  ""]
    if data.targets:
        lines += [f"## {tables.targets_title(data)}", "", *md(tables.targets_table(data))]
    generation = md(tables.generation_table(data))
    if generation:
        lines += [f"## {GENERATION_TITLE}", "", *generation, tables.generation_note(data), ""]
        if kernels := data.environment.get("int8_kernels"):
            lines += [f"**int8 kernels on this CPU:** {kernels}.", ""]
        speedup = md(tables.generation_speedup(data))
        if speedup:
            lines += [f"### {GENERATION_SPEEDUP_TITLE}", "", *speedup]
    for t in data.targets:
        if not t.error and t.grid:
            lines += [f"## {t.name}: ms per sequence", "", *md(tables.latency_grid(data, t.name))]
            speedup = md(tables.speedup_grid(data, t.name))
            if speedup:
                lines += [f"### {t.name}: speed-up over PyTorch fp32", "", *speedup]
    gemm = md(tables.gemm_table(data))
    if gemm:
        lines += ["## GEMM bound at 128 tokens", "", *gemm, tables.GEMM_NOTE, ""]
    sweep = md(tables.sweep_table(data))
    if sweep:
        lines += ["## Thread sweep", "", *sweep]
        if data.serving_default:
            lines += [tables.serving_sentence(data.serving_default), ""]
    return "\n".join(lines) + "\n"


def write_report(directory: Path, data: BenchResults) -> None:
    write_pages(directory, {"report.html": render(data), "report.md": markdown(data)})


def write_pages(directory: Path, pages: dict[str, str]) -> None:
    """Each ``{name: text}`` into ``directory``, atomically (a reader never sees half a page)."""
    for name, text in pages.items():
        tmp = directory / (name + ".tmp")
        tmp.write_text(text, encoding="utf-8")
        tmp.replace(directory / name)
