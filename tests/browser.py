"""Headless chromium for the tests that look at a page (report.html, the documentation site): a screenshot and the
console's errors, and whether the screenshot shows anything."""

from __future__ import annotations

import shutil
import subprocess
import zlib
from pathlib import Path

import pytest

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


def screenshot(uri: str, shot: Path, profile: Path, size: str = "1280,2400") -> list[str]:
    """Render ``uri`` into ``shot`` (PNG) and return the console's error lines; skips the test without chromium."""
    if CHROMIUM is None:
        pytest.skip("chromium is not installed (make test installs Debian's chromium when it runs as root)")
    args = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
            "--disable-background-networking", "--disable-component-update", "--disable-sync",
            f"--user-data-dir={profile}", "--enable-logging=stderr", "--v=0", f"--window-size={size}",
            f"--screenshot={shot}", uri]
    run = subprocess.run(args, capture_output=True, text=True, timeout=120)
    assert shot.is_file(), run.stderr[-2000:]
    return [line for line in run.stderr.splitlines() if "CONSOLE" in line or "Uncaught" in line]


def png_pixels_vary(path: Path) -> bool:
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
