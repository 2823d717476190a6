"""One `kiln serve` process through many consecutive phases of 64 closed-loop clients (issue 27): does a server get
faster the longer it runs (kernels for new batch shapes built on first use), or do its phases only spread?

    python benchmarks/experiments/serve_trend/run.py kiln-out/best [--phases 12]
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1]))  # benchmarks/, for serve_load
from serve_load import closed_loop, kiln_serve, measure, serving_bodies, start, stop  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("artifact")
    parser.add_argument("--phases", type=int, default=12)
    args = parser.parse_args()
    bodies = serving_bodies(args.artifact)
    proc, port = start(kiln_serve(args.artifact))
    try:
        asyncio.run(closed_loop(port, bodies, 64, 256, 60))  # the benchmarks' usual warm-up
        for k in range(args.phases):
            row = measure(port, bodies, 64, 1024, 60, proc.pid)
            print(f"phase {k + 1}: {row['throughput_per_s']:.1f} req/s, p99 {row['p99_ms']:.0f} ms, "
                  f"mean batch {row['batches']['mean_size']:.2f}", flush=True)
    finally:
        stop(proc)


if __name__ == "__main__":
    main()
