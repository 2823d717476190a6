"""One OpenVINO compile per padded width (the batch dimension left dynamic) against one fully dynamic compile, on
one single-thread stream (issue 27): the same 120 batches of 4-8 x 32-192 tokens, in a shuffled order (as kiln
serve's batches come) and grouped by shape (as a sorted offline pass), alternated round by round. Also the memory
each compile holds and whether the outputs differ. Inputs are the engines' warm-up rows repeated (the speed of an
int8 or float graph does not depend on the ids).

Both orders gaining alike means static widths make the kernels faster, not shape changes cheaper: offline and
served would gain together.

    python benchmarks/experiments/openvino_width_static/run.py kiln-out [--variant openvino-int8-static] [--rounds 5]
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "engine_shapes"))
from run import arrays  # noqa: E402  (engine_shapes/run.py)

from kiln.engines.openvino import _call  # noqa: E402  (the call kiln's OpenVINO engine makes)

WIDTHS = tuple(range(32, 208, 16))
CONFIG = {"INFERENCE_PRECISION_HINT": "bf16", "PERFORMANCE_HINT": "LATENCY", "INFERENCE_NUM_THREADS": 1,
          "NUM_STREAMS": 1}


def resident_mib() -> float:
    return int(Path("/proc/self/statm").read_text().split()[1]) * 4096 / 2**20


def main() -> None:
    import openvino as ov

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("artifact", type=Path, help="a kiln optimize output directory")
    parser.add_argument("--variant", default="openvino-int8-static")
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    path = args.artifact / args.variant / "model.xml"
    core = ov.Core()
    before = resident_mib()
    dynamic = core.compile_model(core.read_model(str(path)), "CPU", CONFIG)
    after_dynamic = resident_mib()
    began = time.perf_counter()
    static = {}
    for width in WIDTHS:
        model = core.read_model(str(path))
        model.reshape({i.get_any_name(): ov.PartialShape([-1, width]) for i in model.inputs})
        static[width] = core.compile_model(model, "CPU", CONFIG)
    print(f"the dynamic compile +{after_dynamic - before:.0f} MiB resident; {len(WIDTHS)} width-static compiles in "
          f"{time.perf_counter() - began:.1f} s, +{resident_mib() - after_dynamic:.0f} MiB")
    names = tuple(i.get_any_name() for i in dynamic.inputs)
    out = (dynamic.outputs[0].get_any_name(),)

    def call(request, feed: dict[str, np.ndarray]) -> np.ndarray:
        return _call(request, feed, names, out)[out[0]]

    rng = random.Random(0)
    shuffled = [(rng.randint(4, 8), rng.choice(WIDTHS)) for _ in range(120)]
    orders = {"shuffled": shuffled, "grouped": sorted(shuffled, key=lambda s: (s[1], s[0]))}
    feeds = {shape: arrays(names, *shape) for shape in set(shuffled)}
    one = dynamic.create_infer_request()
    per_width = {width: model.create_infer_request() for width, model in static.items()}
    paths = {"dynamic": lambda shape: one, "per-width static": lambda shape: per_width[shape[1]]}
    worst = 0.0
    for shape, feed in feeds.items():  # every shape run on both paths before timing
        worst = max(worst, float(np.abs(call(one, feed) - call(per_width[shape[1]], feed)).max()))
    print(f"largest output difference over {len(feeds)} shapes: {worst}")
    tokens = sum(b * w for b, w in shuffled)
    rates: dict[str, list[float]] = {f"{p}, {o}": [] for o in orders for p in paths}
    for _ in range(args.rounds):
        for order, shapes in orders.items():
            for name, request_for in paths.items():
                start = time.perf_counter()
                for shape in shapes:
                    call(request_for(shape), feeds[shape])
                rates[f"{name}, {order}"].append(tokens / (time.perf_counter() - start))
    for name, values in rates.items():
        print(f"{name}: {statistics.median(values):.0f} tokens/s ({', '.join(f'{v:.0f}' for v in values)})")


if __name__ == "__main__":
    main()
