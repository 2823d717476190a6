"""Resident memory of greedy generation on a decoder variant, above the loaded engine: what kiln optimize's timing of a
decoder (and a server decoding at that batch) holds.

Random prompts of 16-112 tokens, each continued by 16 tokens, ``--batch`` decoding together (kiln optimize's timing:
32 prompts, batch 4), three rounds on one engine, through kiln's own stepper for the engine (OpenVINO's two infer
requests sharing the cache, ONNX Runtime's IOBinding). Each line: the round's seconds, the resident memory after it
and the process's peak so far, both in MiB.

    python benchmarks/generation_memory.py <variant>/model.xml|model.onnx [--batch 4] [--prompts 32] [--copy-cache]
"""

from __future__ import annotations

import argparse
from pathlib import Path


def status_mib(field: str = "VmRSS") -> int:
    """A /proc/self/status memory field (VmRSS: resident now, VmHWM: the peak) in MiB."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) // 1024
    return 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("graph", type=Path)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--prompts", type=int, default=32)
    parser.add_argument("--shape", default="12,12,64", help="layers,heads,head size of the graph's cache")
    parser.add_argument("--vocab", type=int, default=50000,
                        help="prompt ids are drawn below this (the OpenVINO engine refuses ids outside the vocabulary)")
    parser.add_argument("--copy-cache", action="store_true",
                        help="numpy in, numpy out on the engine's own request (ArraySteps), not kiln's stepper")
    args = parser.parse_args()

    import numpy as np

    from kiln.bench.generation import time_generation
    from kiln.decoder.graph import CacheShape
    from kiln.decoder.steps import ArraySteps
    from kiln.decoder.teacher import TeacherForced
    from kiln.engines import create_engine
    from kiln.engines.base import EngineOptions

    layers, heads, head_size = (int(x) for x in args.shape.split(","))
    engine = create_engine("onnxruntime" if args.graph.suffix == ".onnx" else "openvino", args.graph,
                           EngineOptions(intra_op_threads=2))
    forced = TeacherForced(engine, CacheShape(layers, heads, head_size))
    print(f"engine loaded: {status_mib('VmRSS')} MiB resident, peak {status_mib('VmHWM')}", flush=True)
    rng = np.random.default_rng(3)
    prompts = sorted(([int(t) for t in rng.integers(0, args.vocab, n)] for n in rng.integers(16, 112, args.prompts)),
                     key=len)
    for round_ in range(3):
        steps = ArraySteps(engine, forced.shape) if args.copy_cache else forced.new_stepper()
        seconds = time_generation(steps, 0, prompts, batch_size=args.batch, new_tokens=16,
                                  decode=lambda ids: "")
        print(f"round {round_}: {seconds:.1f} s, {status_mib('VmRSS')} MiB resident, peak {status_mib('VmHWM')}",
              flush=True)


if __name__ == "__main__":
    main()
