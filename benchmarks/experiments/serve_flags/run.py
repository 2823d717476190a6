"""`kiln serve` under different flags, alternated round by round (issue 27): 64 closed-loop clients, a fresh server
per round and flag set, the order flipped each round.

    python benchmarks/experiments/serve_flags/run.py kiln-out/best "" "--max-batch-size 16" [--rounds 3]
"""

from __future__ import annotations

import argparse
import asyncio
import shlex
import statistics
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1]))  # benchmarks/, for serve_load
from serve_load import closed_loop, kiln_serve, measure, serving_bodies, start, stop  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("artifact")
    parser.add_argument("flags", nargs="+", help="one quoted string of kiln serve flags per setting ('' = defaults)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--requests", type=int, default=2048)
    args = parser.parse_args()
    bodies = serving_bodies(args.artifact)
    rates: dict[str, list[float]] = {flags: [] for flags in args.flags}
    for r in range(args.rounds):
        for flags in args.flags if r % 2 == 0 else args.flags[::-1]:
            proc, port = start(kiln_serve(args.artifact, *shlex.split(flags)))
            try:
                asyncio.run(closed_loop(port, bodies, 64, 512, 60))  # warm-up
                row = measure(port, bodies, 64, args.requests, 120, proc.pid)
            finally:
                stop(proc)
            rates[flags].append(row["throughput_per_s"])
            print(f"{flags or '(defaults)'}: {row['throughput_per_s']:.1f} req/s, p99 {row['p99_ms']:.0f} ms, "
                  f"mean batch {row['batches']['mean_size']:.2f}", flush=True)
    for flags, runs in rates.items():
        print(f"{flags or '(defaults)'}: median {statistics.median(runs):.1f} req/s "
              f"(rounds {', '.join(f'{x:.1f}' for x in runs)})")


if __name__ == "__main__":
    main()
