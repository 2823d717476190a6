"""OpenVINO CPU-plugin switches against the default compile on the shape-change cost (issue 27): the same 120
batches of 4-8 x 32-192 tokens as openvino_width_static, on one single-thread stream each, in a shuffled order (as
kiln serve's batches come) and grouped by shape (as a sorted offline pass), alternated round by round; and the
largest output difference from the default compile.

    python benchmarks/experiments/openvino_switches/run.py kiln-out [--variant openvino-int8-static] [--rounds 5]
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
BASE = {"INFERENCE_PRECISION_HINT": "bf16", "PERFORMANCE_HINT": "LATENCY", "INFERENCE_NUM_THREADS": 1,
        "NUM_STREAMS": 1}
# SNIPPETS_MODE: the plugin JIT-fuses element-wise subgraphs ("snippets") and prepares them again per input shape;
# CPU_DENORMALS_OPTIMIZATION: flush denormals to zero (fp32 ops that meet them run far slower otherwise).
SWITCHES = {"default": {}, "no snippets": {"SNIPPETS_MODE": "DISABLE"},
            "denormals flushed": {"CPU_DENORMALS_OPTIMIZATION": True}}


def main() -> None:
    import openvino as ov

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("artifact", type=Path, help="a kiln optimize output directory")
    parser.add_argument("--variant", default="openvino-int8-static")
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    path = str(args.artifact / args.variant / "model.xml")
    core = ov.Core()
    models = {name: core.compile_model(core.read_model(path), "CPU", {**BASE, **extra})
              for name, extra in SWITCHES.items()}
    names = tuple(i.get_any_name() for i in models["default"].inputs)
    out = (models["default"].outputs[0].get_any_name(),)
    requests = {name: model.create_infer_request() for name, model in models.items()}
    rng = random.Random(0)
    shuffled = [(rng.randint(4, 8), rng.choice(WIDTHS)) for _ in range(120)]
    orders = {"shuffled": shuffled, "grouped": sorted(shuffled, key=lambda s: (s[1], s[0]))}
    feeds = {shape: arrays(names, *shape) for shape in set(shuffled)}
    worst = dict.fromkeys(requests, 0.0)
    for feed in feeds.values():  # every shape run on every compile before timing
        reference = _call(requests["default"], feed, names, out)[out[0]]
        for name, request in requests.items():
            difference = np.abs(_call(request, feed, names, out)[out[0]] - reference).max()
            worst[name] = max(worst[name], float(difference))
    print("largest output difference from the default compile: "
          + ", ".join(f"{name} {value:.3g}" for name, value in worst.items()))
    tokens = sum(b * w for b, w in shuffled)
    rates: dict[str, list[float]] = {f"{name}, {order}": [] for order in orders for name in requests}
    for _ in range(args.rounds):
        for order, shapes in orders.items():
            for name, request in requests.items():
                start = time.perf_counter()
                for shape in shapes:
                    _call(request, feeds[shape], names, out)
                rates[f"{name}, {order}"].append(tokens / (time.perf_counter() - start))
    for name, values in rates.items():
        print(f"{name}: {statistics.median(values):.0f} tokens/s ({', '.join(f'{v:.0f}' for v in values)})")


if __name__ == "__main__":
    main()
