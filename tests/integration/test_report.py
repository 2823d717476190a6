"""report.html is one self-contained page; rendered in headless chromium it shows content without errors."""

from __future__ import annotations

import re

import pytest

from tests.browser import png_pixels_vary, screenshot
from tests.integration.test_bench import benched  # noqa: F401  (module fixture: a benchmarked tiny artifact)


def test_page_is_self_contained(benched):  # noqa: F811
    _, out, _ = benched
    html = (out / "report.html").read_text()
    assert "<script" not in html and "<link" not in html and "@import" not in html and "url(" not in html
    assert not re.search(r'(src|href)="https?://', html)
    assert html.count("<svg") >= 4  # latency vs batch per target, vs length, sorted vs unsorted
    for text in ("Engines on the length mix", "ms per sequence (batch size x tokens)", "speed-up over PyTorch fp32",
                 "Thread sweep", "Environment", "Serving default written to the artifact"):
        assert text in html
    md = (out / "report.md").read_text()
    assert "| engine | load s | peak RSS MB |" in md


def test_optimize_writes_the_report_with_the_summary_table(tiny_model, tmp_path):
    from kiln.optimizing.job import OptimizeConfig, OptimizeJob
    from kiln.tasks import TaskName

    OptimizeJob(OptimizeConfig(model=str(tiny_model("bert")), task=TaskName.FEATURE_EXTRACTION, output=tmp_path / "o",
                               variants=("onnx-fp32", "torch-int8-dynamic"), tolerance=1e-5)).run()
    html = (tmp_path / "o" / "report.html").read_text()
    assert "speed vs fidelity" in html and "tolerance 1e-05" in html
    assert "rejected: min_cosine" in html and "accepted (best)" in html


@pytest.mark.browser
def test_report_renders_in_headless_chromium(benched, tmp_path):  # noqa: F811
    _, out, _ = benched
    shot = tmp_path / "report.png"
    console = screenshot((out / "report.html").as_uri(), shot, tmp_path / "profile")
    assert console == [], console
    assert png_pixels_vary(shot)
