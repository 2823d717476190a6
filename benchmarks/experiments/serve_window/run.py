"""kiln serve's look-ahead window (``--batch-window``) against throughput and p99 under 64 closed-loop clients: a
server per window, the windows alternated round by round, two phases of 1,024 requests each (issue 27).

    python benchmarks/experiments/serve_window/run.py kiln-out/best [--windows 32,16,24] [--rounds 3]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # benchmarks/, for serve_load
from serve_load import closed_loop, measure, serving_bodies, start, stop  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("artifact")
    parser.add_argument("--windows", default="32,16,24")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--clients", type=int, default=64)
    args = parser.parse_args()
    bodies = serving_bodies(args.artifact)
    windows = args.windows.split(",")
    rows: dict[str, list[dict]] = {w: [] for w in windows}
    for _ in range(args.rounds):
        for window in windows:
            proc, port = start([sys.executable, "-m", "kiln", "serve", args.artifact, "--batch-window", window])
            try:
                asyncio.run(closed_loop(port, bodies, args.clients, 4 * args.clients, 60))  # warm-up
                for _ in range(2):
                    row = measure(port, bodies, args.clients, 1024, 60)
                    row["padded"] = row["batches"]["mean_padded_tokens"] / row["batches"]["mean_size"]
                    rows[window].append(row)
                    print(f"window {window}: {row['throughput_per_s']:.1f} req/s, p99 {row['p99_ms']:.0f} ms, padded "
                          f"tokens per input {row['padded']:.1f}", flush=True)
            finally:
                stop(proc)
    for window, runs in rows.items():
        rates, p99s = [r["throughput_per_s"] for r in runs], [r["p99_ms"] for r in runs]
        print(f"window {window}: median {statistics.median(rates):.1f} req/s ({min(rates):.1f}-{max(rates):.1f}), p99 "
              f"median {statistics.median(p99s):.0f} ms ({min(p99s):.0f}-{max(p99s):.0f}), padded tokens per input "
              f"{statistics.median(r['padded'] for r in runs):.1f}")


if __name__ == "__main__":
    main()
