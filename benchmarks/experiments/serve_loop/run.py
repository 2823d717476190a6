"""Where kiln serve's event loop spends its CPU under 64 closed-loop clients (issue 27), two ways:
  * ``--mode perf``: ``perf record`` of the server's main thread (on-CPU samples, native code included), then
    ``perf report --sort dso``: interpreted Python against the kernel, uvloop, orjson, httptools...;
  * ``--mode cprofile``: the server runs under a CPU-time cProfile (``time.thread_time``) of its main thread,
    switched on after a warm-up (SIGUSR1) for ``--requests`` requests: microseconds and calls per request by
    function. The profiler slows the loop several times over; compare functions with each other, not with the
    unprofiled server.

    python benchmarks/experiments/serve_loop/run.py kiln-out/best --mode perf|cprofile [--requests 2048]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1]))  # benchmarks/, for serve_load
from serve_load import closed_loop, serving_bodies, start, stop  # noqa: E402

PROFILED = """
import cProfile, signal, sys, time
stats, profile, state = sys.argv.pop(1), cProfile.Profile(time.thread_time), {"on": False}
def toggle(*_):
    (profile.disable if state["on"] else profile.enable)()
    state["on"] = not state["on"]
    if not state["on"]:
        profile.dump_stats(stats)
signal.signal(signal.SIGUSR1, toggle)  # handlers run on the main thread: the event loop's
sys.argv = ["kiln", *sys.argv[1:]]
from kiln.cli.app import main
main()
"""


def perf(pid: int, port: int, bodies: list[bytes], seconds: float, out: Path) -> None:
    data = out / "perf.data"
    record = subprocess.Popen(["perf", "record", "-F", "1999", "-g", "-t", str(pid), "-o", str(data), "--", "sleep",
                               str(seconds)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    phase = asyncio.run(closed_loop(port, bodies, 64, 1_000_000, seconds + 2))
    record.wait()
    print(f"{phase.summary()['throughput_per_s']:.1f} req/s while recorded")
    report = subprocess.run(["perf", "report", "-i", str(data), "--no-children", "--sort", "dso", "--stdio", "-g",
                             "none"], capture_output=True, text=True, check=True).stdout
    print("\n".join(line for line in report.splitlines() if line.strip() and not line.startswith("#")))


def cprofile(pid: int, port: int, bodies: list[bytes], requests: int, stats: Path) -> None:
    import pstats

    os.kill(pid, signal.SIGUSR1)
    phase = asyncio.run(closed_loop(port, bodies, 64, requests, 120))
    os.kill(pid, signal.SIGUSR1)
    for _ in range(100):  # the server writes the stats on its loop's next turn
        if stats.exists():
            break
        time.sleep(0.1)
    answered = phase.summary()["answered"]
    table = pstats.Stats(str(stats)).stats
    total = sum(row[2] for row in table.values())
    print(f"{answered} requests: {1e6 * total / answered:.0f} us of profiled loop CPU a request")
    print("own us/request  with callees  calls/request  function")
    rows = sorted(table.items(), key=lambda kv: -kv[1][2])[:40]
    for (path, line, name), (_, calls, own, cumulative, _) in rows:
        where = path.split("site-packages/")[-1].split("/src/")[-1]
        print(f"{1e6 * own / answered:14.1f}  {1e6 * cumulative / answered:12.1f}  {calls / answered:13.2f}  "
              f"{where}:{line}:{name}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("artifact")
    parser.add_argument("--mode", choices=("perf", "cprofile"), default="perf")
    parser.add_argument("--requests", type=int, default=2048)
    parser.add_argument("--seconds", type=float, default=12.0)
    args = parser.parse_args()
    bodies = serving_bodies(args.artifact)
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp)
        command = [sys.executable, "-m", "kiln", "serve", args.artifact]
        if args.mode == "cprofile":
            command = [sys.executable, "-c", PROFILED, str(out / "loop.prof"), "serve", args.artifact]
        proc, port = start(command)
        try:
            asyncio.run(closed_loop(port, bodies, 64, 1024, 60))  # warm-up
            if args.mode == "perf":
                perf(proc.pid, port, bodies, args.seconds, out)
            else:
                cprofile(proc.pid, port, bodies, args.requests, out / "loop.prof")
        finally:
            stop(proc)


if __name__ == "__main__":
    main()
