"""One kiln serve process against one process per core (issue 27), alternated round by round.

``one``: ``kiln serve ARTIFACT`` with its defaults, 64 closed-loop clients.
``two``: two ``kiln serve ARTIFACT --sessions 1 --threads 1`` processes, each held to one core by ``taskset``,
32 clients each (what SO_REUSEPORT's spread of 64 keep-alive connections would give at best). Each process has
its own interpreter, so its event loop, tokenizer and session never wait for the other's GIL.

    python benchmarks/experiments/serve_processes/run.py kiln-out/best [--rounds 3]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1]))  # benchmarks/, for serve_load
from serve_load import Phase, closed_loop, cpu_seconds, kiln_serve, serving_bodies, start, stop  # noqa: E402


def phase(ports: list[int], bodies: list[bytes], clients: int, requests: int) -> dict:
    """``clients`` split evenly over ``ports``, summarized as one phase (serve_load's Phase) over the slowest port's
    wall time."""
    async def run():
        share = clients // len(ports)
        return await asyncio.gather(*(closed_loop(p, bodies, share, requests // len(ports), 120) for p in ports))

    begin = time.perf_counter()
    parts = asyncio.run(run())
    whole = Phase(latencies=[x for part in parts for x in part.latencies], wall_s=time.perf_counter() - begin)
    for part in parts:
        for outcome, count in part.statuses.items():
            whole.statuses[outcome] = whole.statuses.get(outcome, 0) + count
    return whole.summary()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("artifact")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--clients", type=int, default=64)
    parser.add_argument("--requests", type=int, default=1024)
    args = parser.parse_args()
    bodies = serving_bodies(args.artifact)
    cores = sorted(os.sched_getaffinity(0))
    layouts = {"one": [kiln_serve(args.artifact)],
               "two": [["taskset", "-c", str(c), *kiln_serve(args.artifact, "--sessions", "1", "--threads", "1")]
                       for c in cores[:2]]}
    rows: dict[str, list[dict]] = {name: [] for name in layouts}
    for r in range(args.rounds):
        order = list(layouts) if r % 2 == 0 else list(layouts)[::-1]
        for name in order:
            servers = [start(cmd) for cmd in layouts[name]]
            try:
                ports = [port for _, port in servers]
                phase(ports, bodies, args.clients, 4 * args.clients)  # warm-up
                cpu = sum(cpu_seconds(p.pid) for p, _ in servers)
                begin = time.perf_counter()
                row = phase(ports, bodies, args.clients, args.requests)
                used = sum(cpu_seconds(p.pid) for p, _ in servers) - cpu
                row["server_cores"] = used / (time.perf_counter() - begin)
            finally:
                for proc, _ in servers:
                    stop(proc)
            rows[name].append(row)
            print(f"round {r + 1} {name}: {row['throughput_per_s']:.1f} req/s, p50 {row['p50_ms']:.0f} ms, "
                  f"p99 {row['p99_ms']:.0f} ms, server cores {row['server_cores']:.2f}", flush=True)
    for name, runs in rows.items():
        rates = [x["throughput_per_s"] for x in runs]
        print(f"{name}: median {statistics.median(rates):.1f} req/s (rounds {', '.join(f'{x:.1f}' for x in rates)}), "
              f"p99 median {statistics.median(x['p99_ms'] for x in runs):.0f} ms")


if __name__ == "__main__":
    main()
