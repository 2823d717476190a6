"""Minimal inline-SVG charts: line charts (optionally log-x), grouped bars, and a scatter with a threshold."""

from __future__ import annotations

import math
from collections.abc import Sequence
from html import escape

PALETTE = ("#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf", "#7f7f7f",
           "#bcbd22")
W, H = 560, 320
LEFT, RIGHT, TOP, BOTTOM = 64, 150, 28, 48


LOG_SPAN = 20  # the frontier's x axis turns logarithmic when its fastest timed point is this many times its slowest


def _ticks(lo: float, hi: float, count: int = 5) -> list[float]:
    if hi <= lo:
        return [lo]
    step = 10 ** math.floor(math.log10((hi - lo) / count))
    for mult in (1, 2, 5, 10):
        if (hi - lo) / (step * mult) <= count:
            step *= mult
            break
    start = math.ceil(lo / step) * step
    return [round(start + i * step, 10) for i in range(int((hi - start) / step) + 1)]


def _fmt(v: float) -> str:
    return f"{v:g}" if abs(v) < 1e4 else f"{v:.0e}"


class _Frame:
    def __init__(self, xs: Sequence[float], ys: Sequence[float], log_x: bool, y_zero: bool = True):
        self.log_x = log_x
        tx = [math.log2(x) if log_x else x for x in xs]
        self.x0, self.x1 = min(tx), max(tx)
        if self.x0 == self.x1:
            self.x0, self.x1 = self.x0 - 1, self.x1 + 1
        lo, hi = (0.0 if y_zero else min(ys)), max(ys)
        pad = (hi - lo) * 0.08 or 1.0
        self.y0, self.y1 = (lo if y_zero else lo - pad), hi + pad

    def x(self, v: float) -> float:
        t = math.log2(v) if self.log_x else v
        return LEFT + (t - self.x0) / (self.x1 - self.x0) * (W - LEFT - RIGHT)

    def y(self, v: float) -> float:
        return H - BOTTOM - (v - self.y0) / (self.y1 - self.y0) * (H - TOP - BOTTOM)


def _axes(frame: _Frame, x_ticks: Sequence[float], title: str, x_label: str, y_label: str) -> list[str]:
    parts = [f'<rect x="0" y="0" width="{W}" height="{H}" fill="#fff"/>',
             f'<text x="{LEFT}" y="18" font-size="14" font-weight="bold">{escape(title)}</text>']
    for t in _ticks(frame.y0, frame.y1):
        y = frame.y(t)
        parts.append(f'<line x1="{LEFT}" x2="{W - RIGHT}" y1="{y:.1f}" y2="{y:.1f}" stroke="#e5e5e5"/>')
        parts.append(f'<text x="{LEFT - 6}" y="{y + 4:.1f}" font-size="11" text-anchor="end">{_fmt(t)}</text>')
    for t in x_ticks:
        x = frame.x(t)
        parts.append(f'<line x1="{x:.1f}" x2="{x:.1f}" y1="{H - BOTTOM}" y2="{H - BOTTOM + 4}" stroke="#333"/>')
        parts.append(f'<text x="{x:.1f}" y="{H - BOTTOM + 17}" font-size="11" text-anchor="middle">{_fmt(t)}</text>')
    parts.append(f'<line x1="{LEFT}" x2="{W - RIGHT}" y1="{H - BOTTOM}" y2="{H - BOTTOM}" stroke="#333"/>')
    parts.append(f'<line x1="{LEFT}" x2="{LEFT}" y1="{TOP}" y2="{H - BOTTOM}" stroke="#333"/>')
    parts.append(f'<text x="{(LEFT + W - RIGHT) / 2}" y="{H - 10}" font-size="12" text-anchor="middle">'
                 f'{escape(x_label)}</text>')
    parts.append(f'<text transform="translate(14 {(TOP + H - BOTTOM) / 2}) rotate(-90)" font-size="12" '
                 f'text-anchor="middle">{escape(y_label)}</text>')
    return parts


def _legend(names: Sequence[str]) -> list[str]:
    parts = []
    for i, name in enumerate(names):
        y = TOP + 8 + i * 18
        color = PALETTE[i % len(PALETTE)]
        parts.append(f'<rect x="{W - RIGHT + 12}" y="{y - 9}" width="12" height="12" fill="{color}"/>')
        parts.append(f'<text x="{W - RIGHT + 30}" y="{y + 1}" font-size="11">{escape(name[:22])}</text>')
    return parts


def _svg(parts: list[str], label: str) -> str:
    return (f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {W} {H}" width="{W}" height="{H}" role="img" '
            f'aria-label="{escape(label)}" font-family="sans-serif">' + "".join(parts) + "</svg>")


def line_chart(series: dict[str, list[tuple[float, float]]], *, title: str, x_label: str, y_label: str,
               log_x: bool = True) -> str:
    series = {k: sorted(v) for k, v in series.items() if v}
    if not series:
        return f"<p>{escape(title)}: no data</p>"
    xs = sorted({x for pts in series.values() for x, _ in pts})
    frame = _Frame(xs, [y for pts in series.values() for _, y in pts], log_x)
    # A tick at each measured x reads well for a few sizes (batch 1, 8, 32); a time series gets round ones.
    ticks = xs if log_x or len(xs) <= 8 else _ticks(xs[0], xs[-1])
    parts = _axes(frame, ticks, title, x_label, y_label)
    for i, (name, pts) in enumerate(series.items()):
        color = PALETTE[i % len(PALETTE)]
        path = " ".join(f"{frame.x(x):.1f},{frame.y(y):.1f}" for x, y in pts)
        parts.append(f'<polyline points="{path}" fill="none" stroke="{color}" stroke-width="2"/>')
        for x, y in pts:
            parts.append(f'<circle cx="{frame.x(x):.1f}" cy="{frame.y(y):.1f}" r="3" fill="{color}">'
                         f'<title>{escape(name)}: {_fmt(x)} -> {y:.3g}</title></circle>')
    return _svg(parts + _legend(list(series)), title)


def bar_chart(groups: dict[str, dict[str, float]], *, title: str, y_label: str) -> str:
    """Grouped bars: one group per key of ``groups``, one bar per inner key."""
    if not groups:
        return f"<p>{escape(title)}: no data</p>"
    inner = list(dict.fromkeys(k for g in groups.values() for k in g))
    top = max(v for g in groups.values() for v in g.values())
    frame = _Frame([0, len(groups)], [0, top], log_x=False)
    parts = _axes(frame, [], title, "", y_label)
    slot = (W - LEFT - RIGHT) / len(groups)
    width = slot * 0.8 / len(inner)
    for gi, (group, values) in enumerate(groups.items()):
        x0 = LEFT + gi * slot + slot * 0.1
        for ii, key in enumerate(inner):
            if key not in values:
                continue
            y = frame.y(values[key])
            parts.append(f'<rect x="{x0 + ii * width:.1f}" y="{y:.1f}" width="{width - 2:.1f}" '
                         f'height="{H - BOTTOM - y:.1f}" fill="{PALETTE[ii % len(PALETTE)]}">'
                         f'<title>{escape(group)} {escape(key)}: {values[key]:.3g}</title></rect>')
        parts.append(f'<text x="{x0 + slot * 0.4:.1f}" y="{H - BOTTOM + 15}" font-size="10" text-anchor="middle">'
                     f'{escape(group[:24])}</text>')
    return _svg(parts + _legend(inner), title)


def scatter(points: dict[str, tuple[float, float, bool]], *, title: str, x_label: str, y_label: str,
            threshold: float | None = None, threshold_label: str = "", labelled: Sequence[str] = ()) -> str:
    """Points (x, y, accepted) with hover titles; names written beside ``labelled`` ones (dense clusters of
    near-identical variants would overprint); a horizontal dashed line at ``threshold``."""
    if not points:
        return f"<p>{escape(title)}: no data</p>"
    xs = [p[0] for p in points.values()]
    ys = [p[1] for p in points.values()] + ([threshold] if threshold is not None else [])
    frame = _Frame(xs + [0], ys, log_x=False, y_zero=False)
    parts = _axes(frame, _ticks(frame.x0, frame.x1), title, x_label, y_label)
    if threshold is not None:
        y = frame.y(threshold)
        parts.append(f'<line x1="{LEFT}" x2="{W - RIGHT}" y1="{y:.1f}" y2="{y:.1f}" stroke="#d62728" '
                     f'stroke-dasharray="6 4"/><text x="{W - RIGHT - 4}" y="{y - 5:.1f}" font-size="11" '
                     f'text-anchor="end" fill="#d62728">{escape(threshold_label or f"{threshold:g}")}</text>')
    for name, (x, y, ok) in points.items():
        color = "#2ca02c" if ok else "#d62728"
        parts.append(f'<circle cx="{frame.x(x):.1f}" cy="{frame.y(y):.1f}" r="5" fill="{color}">'
                     f'<title>{escape(name)}: {x:.2f}x, {y:.4f}</title></circle>')
        if name in labelled:
            parts.append(f'<text x="{frame.x(x) + 7:.1f}" y="{frame.y(y) + 4:.1f}" font-size="10">'
                         f'{escape(name)}</text>')
    return _svg(parts, title)


def frontier_chart(groups: dict[str, list[tuple[float, float, bool, str]]], front: Sequence[tuple[float, float]], *,
                   title: str, x_label: str, y_label: str, threshold: float, threshold_label: str) -> str:
    """Points (x, y, accepted, label) in one colour per group (filled: accepted, hollow: rejected), the Pareto
    frontier as a dashed line through ``front``, the gate as a red line; labels that would overprint an earlier
    one are left to the hover title (the table beside the chart has every point)."""
    everything = [p for pts in groups.values() for p in pts]
    if not everything:
        return f"<p>{escape(title)}: no data</p>"
    timed = [p[0] for p in everything if p[0] > 0]
    # A static student runs hundreds of times faster than any transformer variant: on a linear axis every other
    # point would sit in one pixel column, so past LOG_SPAN the axis is logarithmic, untimed points at its left edge.
    log_x = bool(timed) and max(timed) / min(timed) > LOG_SPAN
    if log_x:
        floor = min(timed) / 2
        groups = {g: [(x if x > 0 else floor, *rest) for x, *rest in pts] for g, pts in groups.items()}
        everything = [p for pts in groups.values() for p in pts]
    frame = _Frame([p[0] for p in everything] + ([] if log_x else [0]), [p[1] for p in everything] + [threshold],
                   log_x=log_x, y_zero=False)
    ticks = [2.0**e for e in range(math.ceil(frame.x0), math.floor(frame.x1) + 1)] if log_x else \
        _ticks(frame.x0, frame.x1)
    parts = _axes(frame, ticks, title, x_label + (" (log scale)" if log_x else ""), y_label)
    y = frame.y(threshold)
    parts.append(f'<line x1="{LEFT}" x2="{W - RIGHT}" y1="{y:.1f}" y2="{y:.1f}" stroke="#d62728" '
                 f'stroke-dasharray="6 4"/><text x="{LEFT + 4}" y="{y + 13:.1f}" font-size="10" '
                 f'fill="#d62728">{escape(threshold_label)}</text>')
    if len(front) > 1:
        path = " ".join(f"{frame.x(x):.1f},{frame.y(v):.1f}" for x, v in sorted(front))
        parts.append(f'<polyline points="{path}" fill="none" stroke="#888" stroke-dasharray="3 3"/>')
    placed: list[tuple[float, float]] = []
    for i, (group, pts) in enumerate(groups.items()):
        color = PALETTE[i % len(PALETTE)]
        for x, v, ok, label in pts:
            cx, cy = frame.x(x), frame.y(v)
            fill = color if ok else "#fff"
            parts.append(f'<circle cx="{cx:.1f}" cy="{cy:.1f}" r="5" fill="{fill}" stroke="{color}" '
                         f'stroke-width="2"><title>{escape(group)} / {escape(label)}: {x:.2f}x, {v:.4f}'
                         f'{"" if ok else " (rejected)"}</title></circle>')
            if (x, v) in front and all(abs(cx - px) > 70 or abs(cy - py) > 12 for px, py in placed):
                placed.append((cx, cy))
                parts.append(f'<text x="{cx + 7:.1f}" y="{cy - 6:.1f}" font-size="10">{escape(label)}</text>')
    return _svg(parts + _legend(list(groups)), title)
