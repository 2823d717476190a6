"""One OpenVINO compile per padded width (the batch dimension left dynamic) against one fully dynamic compile, on
one single-thread stream (issue 27): the same 120 batches of 4-8 x 32-192 tokens, in a shuffled order (as kiln
serve's batches come) and grouped by shape (as a sorted offline pass), alternated round by round (mix.py). Also the
memory each compile holds and whether the outputs differ.

Both orders gaining alike means static widths make the kernels faster, not shape changes cheaper: offline and
served would gain together.

    python benchmarks/experiments/openvino_width_static/run.py kiln-out [--variant openvino-int8-static] [--rounds 5]
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
from mix import CONFIG, WIDTHS, Mix, arguments


def resident_mib() -> float:
    return int(Path("/proc/self/statm").read_text().split()[1]) * 4096 / 2**20


def main() -> None:
    import openvino as ov

    args = arguments(__doc__)
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
    mix = Mix(dynamic)
    one = dynamic.create_infer_request()
    per_width = {width: model.create_infer_request() for width, model in static.items()}
    worst = 0.0
    for shape in mix.feeds:  # every shape run on both paths before timing
        worst = max(worst, float(np.abs(mix.call(one, shape) - mix.call(per_width[shape[1]], shape)).max()))
    print(f"largest output difference over {len(mix.feeds)} shapes: {worst}")
    mix.time({"dynamic": lambda shape: one, "per-width static": lambda shape: per_width[shape[1]]}, args.rounds)


if __name__ == "__main__":
    main()
