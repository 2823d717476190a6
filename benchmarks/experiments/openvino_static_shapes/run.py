"""Issue 27: does compiling OpenVINO's IR per input shape (static) beat one dynamic-shape compile on MiniLM?

Sorted batches of 32 of 1,024 held-out texts (10-200 tokens), padded to multiples of 16 (kiln's OpenVINO pad
multiple), bf16 inference precision where the CPU has it, 2 threads; the two paths alternate for four rounds.

    python benchmarks/experiments/openvino_static_shapes/run.py ARTIFACT [VARIANT]   # default openvino-fp32
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import numpy as np


def main(artifact: Path, variant: str = "openvino-fp32") -> None:
    import openvino as ov

    from kiln.artifact.directory import Artifact
    from kiln.data.workloads import held_out_mix
    from kiln.system.cpu import cpu_info

    encoder = Artifact.open(artifact).encoder()
    texts = held_out_mix(1024, encoder.token_count)
    encodings = encoder.encode(texts)
    order = sorted(range(len(texts)), key=lambda i: len(encodings[i].ids))

    def padded(batch: dict) -> dict:
        width = -(-batch["input_ids"].shape[1] // 16) * 16
        return {k: np.pad(v, ((0, 0), (0, width - v.shape[1]))) for k, v in batch.items()}

    batches = [padded(encoder.collate([encodings[i] for i in order[s : s + 32]])) for s in range(0, 1024, 32)]
    core = ov.Core()
    xml = str(artifact / variant / "model.xml")
    config = {"INFERENCE_PRECISION_HINT": "bf16" if cpu_info().has_bf16 else "f32", "PERFORMANCE_HINT": "LATENCY",
              "INFERENCE_NUM_THREADS": 2}
    dynamic = core.compile_model(core.read_model(xml), "CPU", config)
    names = [i.get_any_name() for i in dynamic.inputs]
    begin, static = time.perf_counter(), {}
    for batch in batches:
        shape = batch["input_ids"].shape
        if shape not in static:
            model = core.read_model(xml)
            model.reshape({n: list(shape) for n in names})
            static[shape] = core.compile_model(model, "CPU", config).create_infer_request()
    print(f"{len(static)} static compiles in {time.perf_counter() - begin:.1f} s")
    one = dynamic.create_infer_request()

    def run_dynamic() -> list:
        return [one.infer({n: b[n] for n in names}, share_outputs=False)[0] for b in batches]

    def run_static() -> list:
        return [static[b["input_ids"].shape].infer({n: b[n] for n in names}, share_outputs=False)[0] for b in batches]

    print("max abs difference", max(float(np.abs(a - b).max()) for a, b in zip(run_dynamic(), run_static())))
    for round_ in range(4):
        for name, run in (("dynamic", run_dynamic), ("static", run_static)):
            begin = time.perf_counter()
            run()
            print(round_, name, f"{1024 / (time.perf_counter() - begin):.1f} seq/s")


if __name__ == "__main__":
    main(Path(sys.argv[1]), *sys.argv[2:3])
