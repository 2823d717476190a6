"""An experiment that was not kept: store GPT-2's tied token table once in the exported graph.

The export kiln ships keeps two copies of a tied embedding: [vocab, hidden] for the token lookup (Gather) and the
transposed [hidden, vocab] that the exporter folds for the LM head (MatMul). ``tied-table.patch`` makes both read
one [hidden, vocab] table (the lookup gathers along axis 1). This script measures both layouts in one run:

1. GPT-2 small (random weights, benchmarks/decoder_latency.py's model): file sizes of fp32 and ONNX Runtime dynamic
   int8, and the median time of one decoding step at batch 1 x past 128 and batch 4 x past 512;
2. a small GPT-2 trained here for ``--minutes`` (benchmarks/decoder_fidelity.py's recipe): ``kiln optimize`` of the
   same weights in both layouts, every variant's size and gate figures.

    git apply benchmarks/experiments/tied_embedding/tied-table.patch
    python benchmarks/experiments/tied_embedding/compare.py [--minutes 10]
    git apply -R benchmarks/experiments/tied_embedding/tied-table.patch

-> benchmarks/experiments/tied_embedding/results.json
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1]))  # benchmarks/: the model builders
sys.path.insert(0, str(HERE.parents[2]))  # the repository: tests.factory

import kiln.decoder.graph as graph  # noqa: E402

if not hasattr(graph, "_tied_embeddings"):
    sys.exit("apply the patch first: git apply benchmarks/experiments/tied_embedding/tied-table.patch")
TIED = graph._tied_embeddings
LAYOUTS = {"one-table": TIED, "two-tables": lambda model: False}


def step_ms(path: Path, batch: int, past: int, runs: int = 15) -> float:
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = 2
    session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    feed = {"input_ids": np.full((batch, 1), 11, np.int64), "attention_mask": np.ones((batch, past + 1), np.int64),
            "position_ids": np.full((batch, 1), past, np.int64)}
    rng = np.random.default_rng(0)
    for i in session.get_inputs():
        if i.name.startswith(graph.PAST_PREFIX):
            feed[i.name] = rng.random((batch, 12, past, 64), dtype=np.float32)
    session.run(None, feed)
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        session.run([graph.LOGITS], feed)
        times.append(time.perf_counter() - start)
    return round(1000 * float(np.median(times)), 2)


def gpt2_small(scratch: Path) -> dict:
    from decoder_latency import build_model

    from kiln.choices import ExportFormat
    from kiln.export.job import ExportConfig, run_export
    from kiln.optimize.onnx_passes import quantize_dynamic_int8
    from kiln.system.cpu import cpu_info, int8_scheme

    model = build_model(scratch / "gpt2-small")
    out = {}
    for layout, rule in LAYOUTS.items():
        graph._tied_embeddings = rule
        directory = scratch / layout
        run_export(ExportConfig(str(model), "text-generation", ExportFormat.ONNX, directory))
        fp32 = directory / "onnx-fp32" / "model.onnx"
        int8 = directory / "int8.onnx"
        quantize_dynamic_int8(fp32, int8, int8_scheme(cpu_info()))
        for name, path in (("fp32", fp32), ("int8-dynamic", int8)):
            out[f"{layout} {name}"] = {"size_mb": round(path.stat().st_size / 1e6, 1),
                                       "step_ms_b1_past128": step_ms(path, 1, 128),
                                       "step_ms_b4_past512": step_ms(path, 4, 512)}
            print(layout, name, out[f"{layout} {name}"], flush=True)
    return out


def trained(scratch: Path, minutes: float) -> dict:
    from decoder_fidelity import train

    from kiln.optimize.job import OptimizeConfig, OptimizeJob

    model = scratch / "gpt2-docs"
    out = {"model": train(model, minutes, 4, 256)}
    for layout, rule in LAYOUTS.items():
        graph._tied_embeddings = rule
        summary = OptimizeJob(OptimizeConfig(model=str(model), task="text-generation",
                                             output=scratch / f"opt-{layout}")).run()
        out[layout] = {o.name: {"size_mb": round(o.size_bytes / 1e6, 1) if o.size_bytes else None,
                                **(o.agreement.figures if o.agreement else {}), **(o.metric or {}),
                                "status": o.status.value} for o in summary.outcomes}
        print(layout, json.dumps(out[layout], indent=1), flush=True)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=10)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        result = {"command": "python " + " ".join(sys.argv), "gpt2_small": gpt2_small(Path(scratch))}
        result["trained"] = trained(Path(scratch), args.minutes)
    (HERE / "results.json").write_text(json.dumps(result, indent=1) + "\n")
    print("->", HERE / "results.json")


if __name__ == "__main__":
    main()
