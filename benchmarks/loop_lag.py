"""Event-loop lag while the batcher forms batches: batch forming on the loop against on its own thread.

    python benchmarks/loop_lag.py ARTIFACT [--window 2048] [--switch-interval 0.0005]

Queues ``window`` single-text requests (5-120 words) at once into a Batcher over a 2 ms fake engine (it releases
the GIL like a runtime) and records how late a 1 ms ticker on the event loop wakes while batches form. "thread"
is kiln's batcher (sort, partition and collation on its former thread); "loop" runs the same work inline on the
event loop, as the batcher did before. Prints the worst lags of each.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import sys
import time

import numpy as np

from kiln.artifact.directory import Artifact
from kiln.serve.batcher import Batcher, BatchLimits


class Quick:
    pad_multiple = 1

    def run(self, inputs):
        time.sleep(0.002)
        return {"last_hidden_state": np.zeros((*inputs["input_ids"].shape, 32), dtype=np.float32)}


async def lags(predictor, encodings, window: int, inline: bool, timeout_s: float = 120.0) -> tuple[list[float], int]:
    """(the ticker's lags in seconds, sorted; batches formed) while ``encodings`` are queued at once and run; a
    TimeoutError past ``timeout_s``."""
    batcher = Batcher(predictor, BatchLimits(window=window, window_requests=window, max_batch_size=64,
                                             max_delay_s=0.001))
    formed = []
    batcher.on_batch = formed.append
    loop = asyncio.get_running_loop()
    if inline:  # the former thread's work done on the event loop itself
        original = loop.run_in_executor

        def run_in_executor(executor, fn, *args):
            if executor is batcher._former:
                future = loop.create_future()
                future.set_result(fn(*args))
                return future
            return original(executor, fn, *args)

        loop.run_in_executor = run_in_executor  # type: ignore[method-assign]
    batcher.start()
    seen, done = [], asyncio.Event()

    async def ticker():
        while not done.is_set():
            before = time.perf_counter()
            await asyncio.sleep(0.001)
            seen.append(time.perf_counter() - before - 0.001)

    submitted = [asyncio.ensure_future(batcher.submit([e])) for e in encodings]
    await asyncio.sleep(0)  # every input queued (that burst of submits is not batch forming)
    tick = asyncio.ensure_future(ticker())
    try:
        await asyncio.wait_for(asyncio.gather(*submitted), timeout=timeout_s)
    finally:
        done.set()
        await tick
        await batcher.close()
    return sorted(seen), len(formed)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("artifact")
    parser.add_argument("--window", type=int, default=2048)
    parser.add_argument("--switch-interval", type=float, default=0.0005)
    args = parser.parse_args()
    predictor = Artifact.open(args.artifact).predictor()
    predictor.engine = Quick()
    rng = random.Random(0)
    encodings = predictor.encoder.encode([" ".join(["word"] * rng.randint(5, 120)) for _ in range(args.window)])
    sys.setswitchinterval(args.switch_interval)
    for name, inline in (("loop", True), ("thread", False)):
        worst = asyncio.run(lags(predictor, encodings, args.window, inline))[0][-5:]
        print(f"batch forming on the {name:<6}: worst ticker lags {[round(1000 * x, 1) for x in worst]} ms")


if __name__ == "__main__":
    main()
