"""The serving install against the full one: size on disk and cold start of `kiln serve` on the bundled MiniLM.

    make install slim && .venv/bin/python benchmarks/slim_install.py [--rounds 3]

Exports MiniLM to ONNX with the full install, then for each venv (.venv: kiln[build,...] as `make install` makes it;
.venv-slim: pip install 'kiln[serve,embed]') measures the size of its site-packages and, per round, the seconds
from starting `kiln serve ARTIFACT` to its first /kiln/embed answer (process start, imports, model load, warm-up).
Writes benchmarks/out/slim_install.json (--json).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

from kiln.serving.process import start_server
from kiln.system.cpu import cpu_info

ROOT = Path(__file__).resolve().parents[1]
VENVS = {"full (make install)": ROOT / ".venv", "serving only (kiln[serve,embed])": ROOT / ".venv-slim"}


def site_packages_mb(venv: Path) -> float:
    (site,) = (venv / "lib").glob("python3*/site-packages")
    out = subprocess.run(["du", "-sk", str(site)], capture_output=True, text=True, check=True).stdout
    return int(out.split()[0]) / 1024


def cold_start(venv: Path, artifact: Path) -> float:
    began = time.perf_counter()
    proc, port = start_server([str(venv / "bin" / "kiln"), "serve", str(artifact)])
    try:
        answer = httpx.post(f"http://127.0.0.1:{port}/kiln/embed", json={"inputs": "first request"}, timeout=60)
        answer.raise_for_status()
        return time.perf_counter() - began
    finally:
        proc.terminate()
        proc.wait(timeout=60)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", type=Path, default=ROOT / "benchmarks" / "out" / "slim_install.json")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        artifact = Path(scratch) / "minilm"
        subprocess.run([str(VENVS["full (make install)"] / "bin" / "kiln"), "export", "-o", str(artifact)],
                       check=True, capture_output=True)
        rows = {}
        for name, venv in VENVS.items():
            times = [cold_start(venv, artifact) for _ in range(args.rounds)]
            rows[name] = {"site_packages_mb": round(site_packages_mb(venv), 1),
                          "cold_start_s": [round(t, 2) for t in times], "cold_start_median_s": statistics.median(times)}
    cpu = cpu_info()
    out = {"command": "python benchmarks/slim_install.py " + " ".join(sys.argv[1:]),
           "cpu": f"{cpu.model} ({cpu.usable_cores} usable cores; {', '.join(cpu.features)})",
           "model": "bundled all-MiniLM-L6-v2, onnx-fp32 (kiln export)", "venvs": rows}
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(out, indent=2) + "\n")
    for name, row in rows.items():
        print(f"{name:<36} site-packages {row['site_packages_mb']:>7.0f} MB   cold start to first answer "
              f"{row['cold_start_median_s']:.2f} s (median of {args.rounds}: {row['cold_start_s']})")


if __name__ == "__main__":
    main()
