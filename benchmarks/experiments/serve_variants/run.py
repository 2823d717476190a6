"""Serving variants (server.py) against each other under 64 closed-loop clients, alternated round by round
(issue 27): requests/s, p99 and the event loop's CPU per request.

    python benchmarks/experiments/serve_variants/run.py kiln-out/best --variants base,outer,nopin [--rounds 4]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1]))  # benchmarks/, for serve_load
sys.path.insert(0, str(HERE.parent / "serve_threads"))
from run import cpu_by_group, cpu_by_thread  # noqa: E402  (serve_threads/run.py)
from serve_load import closed_loop, measure, serving_bodies, start, stop  # noqa: E402

# Variants that act before the interpreter starts: the environment the server process starts with.
ENVIRONMENT = {"bigheap": {"GLIBC_TUNABLES": "glibc.malloc.mmap_threshold=268435456:glibc.malloc.trim_threshold="
                                             "1073741824:glibc.malloc.top_pad=67108864"}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("artifact")
    parser.add_argument("--variants", default="base,outer")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--clients", type=int, default=64)
    args = parser.parse_args()
    bodies = serving_bodies(args.artifact)
    rows: dict[str, list[dict]] = {v: [] for v in args.variants.split(",")}
    for _ in range(args.rounds):
        for variant, runs in rows.items():
            saved = dict(os.environ)
            for part in variant.split("+"):
                os.environ.update(ENVIRONMENT.get(part, {}))
            try:
                proc, port = start([sys.executable, str(HERE / "server.py"), variant, "serve", args.artifact])
            finally:
                os.environ.clear()
                os.environ.update(saved)
            try:
                asyncio.run(closed_loop(port, bodies, args.clients, 4 * args.clients, 60))  # warm-up
                before = cpu_by_thread(proc.pid)
                row = measure(port, bodies, args.clients, 1024, 60)
                row["loop_us"] = 1e6 * cpu_by_group(proc.pid, before)["MainThread"] / row["answered"]
            finally:
                stop(proc)
            runs.append(row)
            print(f"{variant}: {row['throughput_per_s']:.1f} req/s, p99 {row['p99_ms']:.0f} ms, event loop "
                  f"{row['loop_us']:.0f} us a request", flush=True)
    for variant, runs in rows.items():
        rates = [r["throughput_per_s"] for r in runs]
        listed = ", ".join(f"{r:.1f}" for r in rates)
        print(f"{variant}: median {statistics.median(rates):.1f} req/s (rounds {listed}), "
              f"p99 median {statistics.median(r['p99_ms'] for r in runs):.0f} ms, event loop "
              f"{statistics.median(r['loop_us'] for r in runs):.0f} us a request")


if __name__ == "__main__":
    main()
