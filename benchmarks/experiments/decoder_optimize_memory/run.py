"""Where a decoder's optimize peaks, each step in a process of its own: the legacy ONNX export of the reference step
graph (as kiln does it, without constant folding, and with it), and openvino-fp32's generation timing.

    python benchmarks/experiments/decoder_optimize_memory/run.py MODEL_DIR STEP [--onnx F]

STEP: export, export-fold, openvino or pageout.

MODEL_DIR: a GPT-2-small-shaped model (``python benchmarks/optimize_profile.py --keep DIR`` leaves one in DIR/model).
``openvino`` and ``pageout`` convert ``--onnx`` (the exported step graph) to IR first, in a process of its own;
``pageout`` shows the IR's mapped weights resident after the first inference and handed back by kiln's page_out.
Prints resident memory (anonymous / file-backed) and the process's peak (VmHWM) in MiB before and after the step.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path


def status(tag: str) -> None:
    fields = dict(line.split(":", 1) for line in open("/proc/self/status"))
    mib = {k: int(fields[k].split()[0]) // 1024 for k in ("VmRSS", "RssAnon", "RssFile", "VmHWM")}
    print(f"{tag}: rss {mib['VmRSS']} (anon {mib['RssAnon']}, file {mib['RssFile']}), peak {mib['VmHWM']} MiB",
          flush=True)


def export(model_dir: str, fold: bool) -> None:
    import torch

    from kiln.choices import ExportFormat
    from kiln.export.job import ExportConfig, export_variant
    from kiln.model.source import load_source

    if fold:  # kiln exports a step graph unfolded since the sitting after this experiment; this puts folding back
        original = torch.onnx.export
        torch.onnx.export = lambda *a, **k: original(*a, **{**k, "do_constant_folding": True})
    source = load_source(model_dir, "text-generation")
    with torch.no_grad():  # the weights resident, as after optimize's reference run
        source.model(input_ids=torch.ones(4, 64, dtype=torch.long))
    status("model loaded and run")
    out = Path(tempfile.mkdtemp())
    record = export_variant(source, ExportConfig(model=None, task="text-generation", format=ExportFormat.ONNX,
                                                 output=out), out)
    status(f"exported ({sum((out / f).stat().st_size for f in record.files) / 2**20:.0f} MiB of graph)")


def openvino(model_dir: str, onnx: Path) -> None:
    import numpy as np
    import transformers

    from kiln.bench.generation import time_generation
    from kiln.decoder.graph import CacheShape
    from kiln.decoder.steps import stepper
    from kiln.engines.base import EngineOptions
    from kiln.engines.openvino import OpenVinoEngine
    from kiln.tasks.text_generation import TIMING_BATCH, TIMING_NEW_TOKENS

    ir = Path(tempfile.mkdtemp()) / "model.xml"
    subprocess.run([sys.executable, "-c", "import sys; from pathlib import Path; from kiln.optimize.openvino_passes "
                    "import convert; convert(Path(sys.argv[1]), Path(sys.argv[2]))", str(onnx), str(ir)], check=True)
    status("start")
    engine = OpenVinoEngine(ir, EngineOptions(intra_op_threads=2))
    status("compiled")
    steps = stepper(engine, CacheShape.of(transformers.AutoConfig.from_pretrained(model_dir)))
    rng = np.random.default_rng(0)  # optimize's timing: 32 prompts of 16-128 tokens, TIMING_BATCH at a time
    prompts = [list(rng.integers(0, 50000, n)) for n in sorted(rng.integers(16, 128, 32))]
    time_generation(steps, 0, prompts, batch_size=TIMING_BATCH, new_tokens=TIMING_NEW_TOKENS, decode=lambda _: "")
    status(f"timed (batch {TIMING_BATCH}, {TIMING_NEW_TOKENS} new tokens)")


def pageout(onnx: Path) -> None:
    """The IR's mapped weights after the CPU plugin's first inference: resident, then handed back by kiln's
    page_out, and the same logits before and after (a 16-token prefill and 44 steps at batch 4)."""
    import numpy as np
    import openvino as ov

    from kiln.system.memory import mapped_resident, page_out

    ir = Path(tempfile.mkdtemp()) / "model.xml"
    subprocess.run([sys.executable, "-c", "import sys; from pathlib import Path; from kiln.optimize.openvino_passes "
                    "import convert; convert(Path(sys.argv[1]), Path(sys.argv[2]))", str(onnx), str(ir)], check=True)
    compiled = ov.Core().compile_model(str(ir), "CPU", {"INFERENCE_PRECISION_HINT": "f32", "INFERENCE_NUM_THREADS": 2,
                                                        "CPU_RUNTIME_CACHE_CAPACITY": 0})
    request = compiled.create_infer_request()

    def feed(rows: int, new: int, past: int) -> dict[str, np.ndarray]:
        arrays = {}
        for port in compiled.inputs:
            name = port.get_any_name()
            if name.startswith("past"):
                arrays[name] = np.random.default_rng(past).standard_normal((rows, 12, past, 64)).astype(np.float32)
            elif name == "input_ids":
                arrays[name] = np.arange(rows * new).reshape(rows, new).astype(np.int64) * 37 % 50000
            elif name == "attention_mask":
                arrays[name] = np.ones((rows, past + new), np.int64)
            else:
                arrays[name] = np.arange(past, past + new)[None].repeat(rows, 0).astype(np.int64)
        return arrays

    def run() -> list[np.ndarray]:
        return [request.infer(feed(4, 16, 0))[0].copy(), *(request.infer(feed(4, 1, p))[0].copy()
                                                           for p in range(16, 60))]

    bin_path = ir.with_suffix(".bin")
    before = run()
    status(f"after one decode: {mapped_resident(bin_path) >> 20} MiB of model.bin resident")
    released = page_out(bin_path)
    status(f"page_out released {released >> 20} MiB; {mapped_resident(bin_path) >> 20} MiB of model.bin resident")
    after = run()
    status(f"decoded again: {mapped_resident(bin_path) >> 20} MiB of model.bin resident; logits identical: "
           f"{all(np.array_equal(a, b) for a, b in zip(before, after))}")


if __name__ == "__main__":
    model, step = sys.argv[1], sys.argv[2]
    if step == "openvino":
        openvino(model, Path(sys.argv[sys.argv.index("--onnx") + 1]))
    elif step == "pageout":
        pageout(Path(sys.argv[sys.argv.index("--onnx") + 1]))
    else:
        export(model, fold=step == "export-fold")
