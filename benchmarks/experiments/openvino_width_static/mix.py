"""The batch mix and timing loop shared by the single-stream OpenVINO experiments (openvino_width_static,
openvino_switches): 120 batches of 4-8 x 32-192 tokens, in a shuffled order (as kiln serve's batches come) and
grouped by shape (as a sorted offline pass), each path timed on both orders, alternated round by round. Inputs are
the engines' warm-up rows repeated (the speed of an int8 or float graph does not depend on the ids)."""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "engine_shapes"))
from run import arrays  # noqa: E402  (engine_shapes/run.py)

from kiln.engines.openvino import _call  # noqa: E402  (the call kiln's OpenVINO engine makes)

WIDTHS = tuple(range(32, 208, 16))
# One single-thread stream, as each of kiln serve's sessions on a 2-core machine
CONFIG = {"INFERENCE_PRECISION_HINT": "bf16", "PERFORMANCE_HINT": "LATENCY", "INFERENCE_NUM_THREADS": 1,
          "NUM_STREAMS": 1}

Shape = tuple[int, int]  # (batch, width)


def arguments(doc: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("artifact", type=Path, help="a kiln optimize output directory")
    parser.add_argument("--variant", default="openvino-int8-static")
    parser.add_argument("--rounds", type=int, default=5)
    return parser.parse_args()


def orders() -> dict[str, list[Shape]]:
    rng = random.Random(0)
    shuffled = [(rng.randint(4, 8), rng.choice(WIDTHS)) for _ in range(120)]
    return {"shuffled": shuffled, "grouped": sorted(shuffled, key=lambda s: (s[1], s[0]))}


class Mix:
    """The mix's feeds for a model's inputs, and one call on a request."""

    def __init__(self, compiled: Any) -> None:
        self.names = tuple(i.get_any_name() for i in compiled.inputs)
        self.out = (compiled.outputs[0].get_any_name(),)
        self.orders = orders()
        self.feeds = {shape: arrays(self.names, *shape) for shape in set(self.orders["shuffled"])}

    def call(self, request: Any, shape: Shape) -> np.ndarray:
        return _call(request, self.feeds[shape], self.names, self.out)[self.out[0]]

    def time(self, paths: dict[str, Callable[[Shape], Any]], rounds: int) -> None:
        """Tokens/s of each path (shape -> the request that runs it) on each order; prints the medians."""
        tokens = sum(b * w for b, w in self.orders["shuffled"])
        rates: dict[str, list[float]] = {f"{p}, {o}": [] for o in self.orders for p in paths}
        for _ in range(rounds):
            for order, shapes in self.orders.items():
                for name, request_for in paths.items():
                    start = time.perf_counter()
                    for shape in shapes:
                        self.call(request_for(shape), shape)
                    rates[f"{name}, {order}"].append(tokens / (time.perf_counter() - start))
        for name, values in rates.items():
            print(f"{name}: {statistics.median(values):.0f} tokens/s ({', '.join(f'{v:.0f}' for v in values)})")
