"""report.html is one self-contained page; rendered in headless chromium it shows content without errors."""

from __future__ import annotations

import re
import shutil
import subprocess
import zlib
from pathlib import Path

import pytest

from tests.integration.test_bench import benched  # noqa: F401  (module fixture: a benchmarked tiny artifact)

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


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


def _png_pixels_vary(path: Path) -> bool:
    """True when the PNG's decompressed scanlines are not all one colour (a blank page compresses to that)."""
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    idat, pos = b"", 8
    while pos < len(data):
        length = int.from_bytes(data[pos : pos + 4], "big")
        kind = data[pos + 4 : pos + 8]
        if kind == b"IDAT":
            idat += data[pos + 8 : pos + 8 + length]
        pos += 12 + length
    raw = zlib.decompress(idat)
    return len(set(raw)) > 32


@pytest.mark.browser
def test_report_renders_in_headless_chromium(benched, tmp_path):  # noqa: F811
    if CHROMIUM is None:
        pytest.skip("chromium is not installed (make test installs Debian's chromium when it runs as root)")
    _, out, _ = benched
    shot = tmp_path / "report.png"
    args = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
            "--disable-background-networking", "--disable-component-update", "--disable-sync",
            f"--user-data-dir={tmp_path / 'profile'}", "--enable-logging=stderr", "--v=0",
            "--window-size=1280,2400", f"--screenshot={shot}", (out / "report.html").as_uri()]
    run = subprocess.run(args, capture_output=True, text=True, timeout=120)
    assert shot.is_file(), run.stderr[-2000:]
    console = [line for line in run.stderr.splitlines() if "CONSOLE" in line or "Uncaught" in line]
    assert console == [], console
    assert _png_pixels_vary(shot)


