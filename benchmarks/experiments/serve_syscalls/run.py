"""The system calls `kiln serve` makes per request under 64 closed-loop clients (issue 27): ``strace -f -c`` attached
to the server for one measured phase, the counts divided by the requests answered meanwhile. strace slows every
call, so the counts are what this says, not the time column.

    python benchmarks/experiments/serve_syscalls/run.py kiln-out/best [--requests 512] [--stacks mprotect]

``--stacks NAME`` instead records each call of NAME with its native stack (``strace -k``) for 128 requests and
prints the most common innermost library frames above libc.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1]))  # benchmarks/, for serve_load
from serve_load import closed_loop, kiln_serve, serving_bodies, start, stop  # noqa: E402

ROW = re.compile(r"^\s*[\d.]+\s+[\d.]+\s+\d+\s+(\d+)\s+(?:\d+\s+)?(\w+)\s*$")


def traced(artifact: str, clients: int, requests: int, strace_args: list[str], out: Path) -> int:
    """Serve ``artifact``, warm it up, attach strace for one phase of ``requests``; the requests answered."""
    bodies = serving_bodies(artifact)
    proc, port = start(kiln_serve(artifact))
    try:
        asyncio.run(closed_loop(port, bodies, clients, 4 * clients, 60))
        tracer = subprocess.Popen(["strace", "-f", *strace_args, "-o", str(out), "-p", str(proc.pid)],
                                  stderr=subprocess.DEVNULL)
        time.sleep(1.0)  # attached to every thread before the phase starts
        phase = asyncio.run(closed_loop(port, bodies, clients, requests, 120))
        tracer.terminate()
        tracer.wait()
    finally:
        stop(proc)
    return phase.statuses.get("200", 0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("artifact")
    parser.add_argument("--clients", type=int, default=64)
    parser.add_argument("--requests", type=int, default=512)
    parser.add_argument("--stacks", help="a system call whose native stacks to tally")
    args = parser.parse_args()
    out = Path(tempfile.mkdtemp()) / "strace.out"
    if args.stacks:
        answered = traced(args.artifact, args.clients, 128, ["-k", "-e", f"trace={args.stacks}"], out)
        calls, frames = 0, collections.Counter()
        for call in re.split(r"\n(?=\d+\s+\w+\()", out.read_text()):
            stack = [line for line in call.splitlines()[1:] if line.lstrip().startswith(">")]
            if not stack:
                continue
            calls += 1
            above = next((f for f in stack if "libc.so" not in f), "?")
            frames[re.sub(r"\s*\[0x[0-9a-f]+\]$", "", above.strip(" >"))[-140:]] += 1
        print(f"{args.stacks}: {calls} calls, {calls / answered:.1f} a request ({answered} requests)")
        for frame, count in frames.most_common(8):
            print(f"  {count:6d}  {frame}")
        return
    answered = traced(args.artifact, args.clients, args.requests, ["-c"], out)
    print(f"{answered} requests answered while traced; system calls a request:")
    for line in out.read_text().splitlines():
        match = ROW.match(line)
        if match and int(match[1]) / answered >= 0.05:
            print(f"  {match[2]:<20} {int(match[1]) / answered:7.2f}")


if __name__ == "__main__":
    main()
