"""Where a decoder's optimize peaks, each step in a process of its own: the legacy ONNX export of the reference step
graph (as kiln does it, without constant folding, and with it), and openvino-fp32's generation timing.

    python benchmarks/experiments/decoder_optimize_memory/run.py MODEL_DIR {export,export-fold,openvino} [--onnx F]

MODEL_DIR: a GPT-2-small-shaped model (``python benchmarks/optimize_profile.py --keep DIR`` leaves one in DIR/model).
``openvino`` converts ``--onnx`` (the exported step graph) to IR first, in a process of its own. Prints resident
memory (anonymous / file-backed) and the process's peak (VmHWM) in MiB before and after the step.
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


if __name__ == "__main__":
    model, step = sys.argv[1], sys.argv[2]
    if step == "openvino":
        openvino(model, Path(sys.argv[sys.argv.index("--onnx") + 1]))
    else:
        export(model, fold=step == "export-fold")
