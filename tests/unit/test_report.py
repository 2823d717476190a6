"""The report's charts, drawn from numbers alone."""

from __future__ import annotations

from tests.integration.test_bench import benched  # noqa: F401  (module fixture: a benchmarked tiny artifact)


def test_the_frontier_chart_turns_logarithmic_when_speed_ups_span_a_wide_range():
    """A static student hundreds of times faster would squash every transformer variant into one pixel column on a
    linear axis; untimed points then sit at the left edge."""
    import re

    from kiln.report.svg import frontier_chart

    def chart(speedups: list[float]) -> str:
        points = [(x, 0.99, True, f"v{i}") for i, x in enumerate(speedups)]
        return frontier_chart({"model": points}, [(x, 0.99) for x in speedups if x], title="t", x_label="speed-up",
                              y_label="agreement", threshold=0.99, threshold_label="gate")

    linear, wide = chart([1.0, 2.0, 3.0]), chart([0.0, 1.0, 2.0, 300.0])
    assert "log scale" not in linear and "speed-up (log scale)" in wide

    def centre(svg: str, label: str) -> float:
        return float(re.search(rf'<circle cx="([\d.]+)"[^>]*><title>model / {label}:', svg).group(1))

    # equal ratios, equal distances: 1x -> 2x spans as much as 2x -> 4x would, and 0 (untimed) is left of 1x
    assert centre(wide, "v0") < centre(wide, "v1") < centre(wide, "v2") < centre(wide, "v3")
    assert centre(wide, "v2") - centre(wide, "v1") > 0.1 * (centre(wide, "v3") - centre(wide, "v1"))
