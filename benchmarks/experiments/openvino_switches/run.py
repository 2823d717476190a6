"""OpenVINO CPU-plugin switches against the default compile on the shape-change cost (issue 27): the same 120
batches of 4-8 x 32-192 tokens as openvino_width_static (its mix.py), on one single-thread stream each, in a
shuffled order (as kiln serve's batches come) and grouped by shape (as a sorted offline pass), alternated round by
round; and the largest output difference from the default compile.

    python benchmarks/experiments/openvino_switches/run.py kiln-out [--variant openvino-int8-static] [--rounds 5]
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "openvino_width_static"))
from mix import CONFIG, Mix, arguments  # noqa: E402  (openvino_width_static/mix.py)

# SNIPPETS_MODE: the plugin JIT-fuses element-wise subgraphs ("snippets") and prepares them again per input shape;
# CPU_DENORMALS_OPTIMIZATION: flush denormals to zero (fp32 ops that meet them run far slower otherwise).
SWITCHES = {"default": {}, "no snippets": {"SNIPPETS_MODE": "DISABLE"},
            "denormals flushed": {"CPU_DENORMALS_OPTIMIZATION": True}}


def main() -> None:
    import openvino as ov

    args = arguments(__doc__)
    path = str(args.artifact / args.variant / "model.xml")
    core = ov.Core()
    models = {name: core.compile_model(core.read_model(path), "CPU", {**CONFIG, **extra})
              for name, extra in SWITCHES.items()}
    mix = Mix(models["default"])
    requests = {name: model.create_infer_request() for name, model in models.items()}
    worst = dict.fromkeys(requests, 0.0)
    for shape in mix.feeds:  # every shape run on every compile before timing
        reference = mix.call(requests["default"], shape)
        for name, request in requests.items():
            worst[name] = max(worst[name], float(np.abs(mix.call(request, shape) - reference).max()))
    print("largest output difference from the default compile: "
          + ", ".join(f"{name} {value:.3g}" for name, value in worst.items()))
    mix.time({name: (lambda shape, r=request: r) for name, request in requests.items()}, args.rounds)


if __name__ == "__main__":
    main()
