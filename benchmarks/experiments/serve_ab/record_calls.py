"""`python record_calls.py OUT.json serve ARTIFACT ...`: kiln's CLI with every engine call of the batcher timed on
its session's thread ((start, end) per thread name, perf_counter), written to OUT.json when the server exits."""

from __future__ import annotations

import atexit
import json
import sys
import threading
import time

from kiln.serve import batcher

calls: dict[str, list[tuple[float, float]]] = {}
forward = batcher.Batcher._forward


def timed_forward(self, engine, arrays):
    start = time.perf_counter()
    try:
        return forward(self, engine, arrays)
    finally:
        calls.setdefault(threading.current_thread().name, []).append((start, time.perf_counter()))


batcher.Batcher._forward = timed_forward
out = sys.argv.pop(1)
atexit.register(lambda: json.dump(calls, open(out, "w")))

from kiln.cli.app import main  # noqa: E402  (after the patch)

sys.argv[0] = "kiln"
main()
