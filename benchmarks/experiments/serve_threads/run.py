"""Where a `kiln serve` process's CPU goes under 64 closed-loop clients: cores used per thread group (Linux /proc),
with the batches the server formed (issue 27).

Python threads are named from a py-spy dump of the server (py-spy must be on PATH or beside this interpreter);
threads py-spy does not list are the engine's own (OpenVINO's stream threads, ONNX Runtime's pool).

    python benchmarks/experiments/serve_threads/run.py kiln-out/best [--rounds 3] [-- extra kiln serve options]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # benchmarks/, for serve_load
from serve_load import closed_loop, cpu_seconds, measure, serving_bodies, start, stop  # noqa: E402

ENGINE_OWN = "engine's own threads"


def cpu_by_thread(pid: int) -> dict[str, float]:
    """CPU seconds (user + system) of each thread of ``pid``, by thread id."""
    seconds = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        with contextlib.suppress(OSError):  # the thread ended
            seconds[tid] = cpu_seconds(pid, int(tid))
    return seconds


def python_thread_names(pid: int) -> dict[str, str]:
    """Thread id -> Python thread name, without the pool index (kiln-tokenize_1 -> kiln-tokenize)."""
    spy = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    dump = subprocess.run([spy, "dump", "--pid", str(pid)], capture_output=True, text=True, check=True).stdout
    return {m.group(1): m.group(2).rstrip("0123456789_-") for m in
            re.finditer(r'Thread (?:0x[0-9a-f]+ )?\(?(\d+)\)? \(\w+\): "([^"]+)"', dump)}


def cpu_by_group(pid: int, before: dict[str, float]) -> dict[str, float]:
    """CPU seconds of ``pid``'s threads since ``before`` (cpu_by_thread), by Python thread name; the threads py-spy
    does not list are the engine's own."""
    after, names = cpu_by_thread(pid), python_thread_names(pid)
    seconds: dict[str, float] = {}
    for tid, used in after.items():
        group = names.get(tid, ENGINE_OWN)
        seconds[group] = seconds.get(group, 0.0) + used - before.get(tid, 0.0)
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("artifact")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--clients", type=int, default=64)
    args, serve_args = parser.parse_known_args()  # the rest go to kiln serve
    bodies = serving_bodies(args.artifact)
    extra = [a for a in serve_args if a != "--"]
    proc, port = start([sys.executable, "-m", "kiln", "serve", args.artifact, *extra])
    try:
        asyncio.run(closed_loop(port, bodies, args.clients, 4 * args.clients, 60))  # warm-up
        for _ in range(args.rounds):
            before = cpu_by_thread(proc.pid)
            row = measure(port, bodies, args.clients, 1024, 60)  # the phase, and the batches kiln serve formed
            cores = {group: s / row["wall_s"] for group, s in cpu_by_group(proc.pid, before).items()}
            batches = row["batches"]
            print(f"{row['throughput_per_s']:.1f} req/s, p99 {row['p99_ms']:.0f} ms, batches of "
                  f"{batches['mean_size']:.1f}, padded tokens per input "
                  f"{batches['mean_padded_tokens'] / batches['mean_size']:.1f} | cores: "
                  + ", ".join(f"{group} {used:.2f}" for group, used in sorted(cores.items(), key=lambda kv: -kv[1])
                              if used >= 0.005), flush=True)
    finally:
        stop(proc)


if __name__ == "__main__":
    main()
