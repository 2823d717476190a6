"""Where kiln serve's Python threads run, against throughput under 64 closed-loop clients, alternated phase by phase
in one server (issue 27). Needs permission to change another process's threads (the same user; root for nothing):
  * ``--mode affinity``: Python's threads on core 0 only, the engine's threads left where they are;
  * ``--mode sched-batch``: Python's threads under SCHED_BATCH, so that their wake-ups do not preempt the engine's
    threads (counted: the engine threads' involuntary context switches, Python's voluntary ones).

    python benchmarks/experiments/serve_threads/placement.py kiln-out/best --mode sched-batch [--rounds 4]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # benchmarks/, for serve_load
sys.path.insert(0, str(Path(__file__).resolve().parent))
from run import python_thread_names  # noqa: E402
from serve_load import closed_loop, measure, serving_bodies, start, stop  # noqa: E402


def switches(pid: int, tids: list[str]) -> tuple[int, int]:
    """(voluntary, involuntary) context switches of ``tids`` so far."""
    voluntary = involuntary = 0
    for tid in tids:
        with open(f"/proc/{pid}/task/{tid}/status") as status:
            fields = dict(line.split(":\t", 1) for line in status.read().splitlines() if ":\t" in line)
        voluntary += int(fields["voluntary_ctxt_switches"])
        involuntary += int(fields["nonvoluntary_ctxt_switches"])
    return voluntary, involuntary


def place(tids: list[str], mode: str, on: bool) -> None:
    for tid in tids:
        if mode == "affinity":
            os.sched_setaffinity(int(tid), {0} if on else set(range(os.cpu_count() or 1)))
        else:
            os.sched_setscheduler(int(tid), os.SCHED_BATCH if on else os.SCHED_OTHER, os.sched_param(0))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("artifact")
    parser.add_argument("--mode", choices=("affinity", "sched-batch"), required=True)
    parser.add_argument("--rounds", type=int, default=4)
    args = parser.parse_args()
    bodies = serving_bodies(args.artifact)
    proc, port = start([sys.executable, "-m", "kiln", "serve", args.artifact])
    try:
        asyncio.run(closed_loop(port, bodies, 64, 256, 60))  # warm-up
        python = list(python_thread_names(proc.pid))
        engine = [t for t in os.listdir(f"/proc/{proc.pid}/task") if t not in python]
        for _ in range(args.rounds):
            for on in (False, True):
                place(python, args.mode, on)
                engine_before, python_before = switches(proc.pid, engine), switches(proc.pid, python)
                row = measure(port, bodies, 64, 1024, 60)
                engine_after, python_after = switches(proc.pid, engine), switches(proc.pid, python)
                print(f"{args.mode} {'on ' if on else 'off'}: {row['throughput_per_s']:.1f} req/s, p99 "
                      f"{row['p99_ms']:.0f} ms; engine threads' involuntary switches "
                      f"{(engine_after[1] - engine_before[1]) / row['wall_s']:.0f}/s, Python threads' wake-ups "
                      f"{(python_after[0] - python_before[0]) / row['wall_s']:.0f}/s", flush=True)
    finally:
        stop(proc)


if __name__ == "__main__":
    main()
