"""The documentation site builds with `mkdocs build --strict` (a broken link or reference fails it), holds the pages
made from the code (the CLI reference, the task table, the API from docstrings, the current benchmark figures), and
renders in headless chromium without console errors."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from kiln.tasks import TASKS
from tests.browser import png_pixels_vary, screenshot

ROOT = Path(__file__).resolve().parents[2]
MKDOCS = Path(sys.executable).with_name("mkdocs")


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    if not MKDOCS.exists():
        pytest.skip("mkdocs is installed by make (the [docs] extra)")
    out = tmp_path_factory.mktemp("site")
    build = subprocess.run([str(MKDOCS), "build", "--strict", "--site-dir", str(out)], cwd=ROOT, capture_output=True,
                           text=True, timeout=300, env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})
    assert build.returncode == 0, build.stderr[-3000:]
    return out


def test_the_site_holds_the_pages_made_from_the_code(site):
    cli = (site / "cli.html").read_text()
    for command in ("optimize", "export", "distill", "prune", "embed", "bench", "serve", "audit", "triton", "info",
                    "doctor"):
        assert f"kiln {command}" in cli
    assert "--batch-size" in cli and "--for" in cli
    tasks = (site / "tasks.html").read_text()
    assert all(f"<code>{name}</code>" in tasks for name in TASKS)
    api = (site / "api.html").read_text()
    assert "kiln.api.build.optimize" in api and "OptimizeResult" in api and "kiln.api.deploy.serve" in api
    assert "What was tried and closed" in (site / "performance.html").read_text()


@pytest.mark.browser
@pytest.mark.parametrize("page", ["index.html", "cli.html", "performance.html"])
def test_pages_render_in_headless_chromium(site, page, tmp_path):
    shot = tmp_path / "page.png"
    console = screenshot((site / page).as_uri(), shot, tmp_path / "profile", size="1280,1600")
    uncaught = [line for line in console if "Uncaught" in line]
    assert uncaught == [], uncaught
    assert png_pixels_vary(shot)
