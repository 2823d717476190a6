"""Two kiln source trees' `kiln serve` under 64 closed-loop clients, alternated round by round (issue 27): throughput,
p99, the event loop's and the session threads' CPU per request, and each engine session's idle time between its
calls (timed on its thread by record_calls.py). Compare the working tree against an earlier commit checked out
with ``git worktree add``:

    git worktree add /tmp/kiln-before HEAD~1
    python benchmarks/experiments/serve_ab/run.py kiln-out/best --baseline-src /tmp/kiln-before/src [--rounds 3]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1]))  # benchmarks/, for serve_load
sys.path.insert(0, str(HERE.parent / "serve_threads"))
from run import cpu_by_group, cpu_by_thread  # noqa: E402  (serve_threads/run.py)
from serve_load import closed_loop, measure, serving_bodies, start, stop  # noqa: E402


def idle_between_calls(path: Path, after: float) -> tuple[float, float]:
    """(median gap ms, idle share of the span) between consecutive calls of each session, calls from ``after`` on."""
    gaps, idle, span = [], 0.0, 0.0
    for session in json.loads(path.read_text()).values():
        session = [c for c in session if c[0] >= after]
        own = [b[0] - a[1] for a, b in zip(session, session[1:])]
        gaps += own
        idle += sum(own)
        span += session[-1][1] - session[0][0] if session else 0.0
    return 1000 * statistics.median(gaps), idle / span if span else 0.0


def phase(source: str | None, artifact: str, bodies: list[bytes], clients: int, requests: int = 1024) -> dict:
    """One server of ``source`` (None: this tree): warm-up, then a measured phase of ``requests``."""
    env = os.environ.get("PYTHONPATH")
    if source:
        os.environ["PYTHONPATH"] = source  # the server imports kiln from there, ahead of the installed one
    calls = Path(tempfile.mkstemp(suffix=".json")[1])
    try:
        proc, port = start([sys.executable, str(HERE / "record_calls.py"), str(calls), "serve", artifact])
    finally:
        if env is None:
            os.environ.pop("PYTHONPATH", None)
        else:
            os.environ["PYTHONPATH"] = env
    try:
        asyncio.run(closed_loop(port, bodies, clients, 4 * clients, 60))  # warm-up
        began = time.perf_counter()  # the same clock as the server's (CLOCK_MONOTONIC, one machine)
        before = cpu_by_thread(proc.pid)
        row = measure(port, bodies, clients, requests, 120)
        used = cpu_by_group(proc.pid, before)
        row["loop_us"] = 1e6 * used["MainThread"] / row["answered"]
        # the session threads' own CPU (the Python around each engine call, not the engine's stream threads)
        row["sessions_us"] = 1e6 * used.get("kiln-engine", 0.0) / row["answered"]
    finally:
        stop(proc)
    row["gap_ms"], row["idle"] = idle_between_calls(calls, began)
    calls.unlink()
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("artifact")
    parser.add_argument("--baseline-src", required=True, help="the src/ directory of the kiln to compare against")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--clients", type=int, default=64)
    parser.add_argument("--requests", type=int, default=1024, help="measured per phase (more: a steadier p99)")
    args = parser.parse_args()
    bodies = serving_bodies(args.artifact)
    trees = {"baseline": args.baseline_src, "this tree": None}
    rows: dict[str, list[dict]] = {name: [] for name in trees}
    for _ in range(args.rounds):
        for name, source in trees.items():
            row = phase(source, args.artifact, bodies, args.clients, args.requests)
            rows[name].append(row)
            print(f"{name}: {row['throughput_per_s']:.1f} req/s, p99 {row['p99_ms']:.0f} ms, batches of "
                  f"{row['batches']['mean_size']:.1f}, event loop {row['loop_us']:.0f} us a request, session threads "
                  f"{row['sessions_us']:.0f} us, "
                  f"between calls {row['gap_ms']:.2f} ms (median), sessions idle "
                  f"{100 * row['idle']:.1f}%", flush=True)
    for name, runs in rows.items():
        rates, p99s = [r["throughput_per_s"] for r in runs], [r["p99_ms"] for r in runs]
        print(f"{name}: median {statistics.median(rates):.1f} req/s ({min(rates):.1f}-{max(rates):.1f}), p99 median "
              f"{statistics.median(p99s):.0f} ms ({min(p99s):.0f}-{max(p99s):.0f}), event loop "
              f"{statistics.median(r['loop_us'] for r in runs):.0f} us a request, session threads "
              f"{statistics.median(r['sessions_us'] for r in runs):.0f} us, sessions idle between calls "
              f"{100 * statistics.median(r['idle'] for r in runs):.1f}%")


if __name__ == "__main__":
    main()
