"""What an engine call costs beside its tokens, on the sessions kiln.load's split plan opens (issue 27):
  * by batch size at one length (tokens/s of all sessions at once): the per-call cost;
  * the same 120 batches of mixed shapes (4-8 x 32-192 tokens) in a shuffled order, as kiln serve's batches come,
    against grouped by shape, as sorted offline batches come: what a shape change between calls costs. Over the
    wall time (as a pass sees it) and as the sum of each session's own rate (without the uneven split of shuffled
    calls between the sessions, which a server does not have: its sessions take the next batch when they free).
  * one session alone, calls cycling through three shapes that differ in batch size only, in width only, or in
    both, against one shape throughout: which kind of change costs (the batch dimension, the width or neither).
Inputs are the engines' warm-up rows repeated (the speed of an int8 or float graph does not depend on the ids).

    python benchmarks/experiments/engine_shapes/run.py kiln-out/best [--length 112] [--rounds 5] [--kernel-cache N]
        [--bounded 64,256]

``--kernel-cache N`` sets OpenVINO's CPU_RUNTIME_CACHE_CAPACITY (default 5,000 kernels) on the sessions, to see
whether shape changes cost kernel rebuilds that a larger cache would keep. ``--bounded B,L`` compiles the model with
upper bounds on its token inputs ([1..B, 1..L] instead of [?, ?]), which OpenVINO recommends for memory reuse
under dynamic shapes: does a bounded shape make a change between calls cheaper?
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

from kiln.artifact.directory import Artifact
from kiln.engines.base import warmup_inputs


def arrays(input_names: tuple[str, ...], batch: int, length: int) -> dict[str, np.ndarray]:
    """``batch`` copies of the engines' warm-up row of ``length`` tokens."""
    return {name: np.repeat(row, batch, axis=0) for name, row in warmup_inputs(input_names, length).items()}


def compiled_with(capacity: int | None, bounds: tuple[int, int] | None) -> None:
    """Every OpenVINO model compiled from now on keeps ``capacity`` kernels in its per-shape cache (None: OpenVINO's
    default) and has its inputs bounded to [1..batch, 1..length] by ``bounds`` (None: left [?, ?])."""
    import openvino as ov

    compile_model = ov.Core.compile_model

    def configured(self, model, device=None, config=None, *args, **kwargs):
        if capacity is not None:
            config = {**(config or {}), "CPU_RUNTIME_CACHE_CAPACITY": capacity}
        if bounds is not None and not isinstance(model, (str, Path)):
            model.reshape({i.get_any_name(): ov.PartialShape([ov.Dimension(1, bounds[0]), ov.Dimension(1, bounds[1])])
                           for i in model.inputs})
        return compile_model(self, model, device, config, *args, **kwargs)

    ov.Core.compile_model = configured


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("artifact")
    parser.add_argument("--length", type=int, default=112)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--kernel-cache", type=int, default=None)
    parser.add_argument("--bounded", default=None, help="B,L: inputs bounded to [1..B, 1..L]")
    args = parser.parse_args()
    bounds = tuple(int(v) for v in args.bounded.split(",")) if args.bounded else None
    if args.kernel_cache is not None or bounds is not None:
        compiled_with(args.kernel_cache, bounds)
    artifact = Artifact.open(args.artifact)
    variant = artifact.variant_name()
    engines = artifact.predictor(variant, artifact.serving_plan(variant, split_cores=True)).sessions
    pool = ThreadPoolExecutor(len(engines))

    def tokens_per_s(calls: list[tuple[int, int]], inputs: dict) -> tuple[float, float]:
        """All sessions at once, each taking every len(engines)-th call: (all tokens over the wall time, the sum of
        each session's tokens over its own time). Shuffled shapes split unevenly (one session gets more tokens and
        the other then idles), which the wall-time figure counts as a slowdown and the per-session one does not."""
        def work(k: int) -> tuple[int, float]:
            begin = time.perf_counter()
            own = calls[k :: len(engines)]
            for shape in own:
                engines[k].run(inputs[shape])
            return sum(b * n for b, n in own), time.perf_counter() - begin

        start = time.perf_counter()
        parts = list(pool.map(work, range(len(engines))))
        wall = sum(b * n for b, n in calls) / (time.perf_counter() - start)
        return wall, sum(tokens / seconds for tokens, seconds in parts)

    rng = random.Random(0)
    mixed = [(rng.randint(4, 8), rng.choice(range(32, 208, 16))) for _ in range(120)]
    sizes = [1, 2, 4, 6, 8, 12, 16]
    inputs = {shape: arrays(engines[0].input_names, *shape) for shape in {*mixed, *((b, args.length) for b in sizes)}}
    for engine in engines:  # every shape compiled on every session before timing
        for shape in inputs:
            engine.run(inputs[shape])
    by_size: dict[int, list[float]] = {b: [] for b in sizes}
    orders = {"shuffled shapes": mixed, "grouped by shape": sorted(mixed, key=lambda s: (s[1], s[0]))}
    by_order: dict[str, list[float]] = {name: [] for name in orders}
    by_order.update({f"{name}, each session's own rate": [] for name in orders})
    for _ in range(args.rounds):
        for b in sizes:
            by_size[b].append(tokens_per_s([(b, args.length)] * len(engines) * max(4, 96 // b), inputs)[0])
        for name, calls in orders.items():
            wall, own = tokens_per_s(calls, inputs)  # both figures from the same calls
            by_order[name].append(wall)
            by_order[f"{name}, each session's own rate"].append(own)
    print(f"{variant}: {len(engines)} session(s); tokens/s of all sessions, median of {args.rounds} rounds")
    for b in sizes:
        print(f"batch {b:2d} x {args.length}: {statistics.median(by_size[b]):8.0f}")
    for name, rates in by_order.items():
        print(f"{name}: {statistics.median(rates):8.0f} (rounds {', '.join(f'{r:.0f}' for r in rates)})")
    by_change = changes(engines[0], args.length, args.rounds)
    print(f"one session, calls cycling through ({args.length} tokens, batch 8 where fixed), tokens/s:")
    for name, rates in by_change.items():
        print(f"  {name}: {statistics.median(rates):8.0f} ({min(rates):.0f}-{max(rates):.0f})")


def changes(engine, length: int, rounds: int, calls: int = 60) -> dict[str, list[float]]:
    """Tokens/s of one session whose consecutive calls keep one shape, or cycle through three shapes that differ in
    batch size only, in width only (+-16 tokens) or in both at a similar token count; rounds alternate."""
    cycles = {"one shape": [(8, length)],
              "batch size changes (7, 8, 9)": [(7, length), (8, length), (9, length)],
              "width changes (-16, 0, +16)": [(8, length - 16), (8, length), (8, length + 16)],
              "both change": [(10, length - 16), (8, length), (6, length + 16)]}
    inputs = {shape: arrays(engine.input_names, *shape) for cycle in cycles.values() for shape in cycle}
    for shape in inputs:
        engine.run(inputs[shape])
    rates: dict[str, list[float]] = {name: [] for name in cycles}
    for _ in range(rounds):
        for name, cycle in cycles.items():
            shapes = [cycle[k % len(cycle)] for k in range(calls)]
            start = time.perf_counter()
            for shape in shapes:
                engine.run(inputs[shape])
            rates[name].append(sum(b * n for b, n in shapes) / (time.perf_counter() - start))
    return rates


if __name__ == "__main__":
    main()
