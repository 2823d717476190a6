"""kiln optimize --for: judging the OpenVINO variants for a CPU class with fewer instructions than this one.

An int8 variant's answers depend on the kernels its CPU runs (AVX2's u8s8 GEMM with 7-bit weights, VNNI's VPDPBUSD,
AMX tiles), so passing the gate here says little about an AVX2 laptop. OpenVINO's CPU plugin builds its kernels with
oneDNN, which takes ONEDNN_MAX_CPU_ISA: capped to a lesser class's instructions, this CPU runs that class's kernels.
On the AMX Xeon, MiniLM's int8 IR then ran its MatMuls as jit_gemm_I8 (AVX2) instead of brgemm_avx512_amx_I8, and its
token vectors moved by up to 1.36. The cap is read once, when the plugin loads, so each class is judged in a process of
its own, on the sealed staging directory, with the checks kiln.artifact.cpu_pick runs at load on a new class. The
kernels each MatMul ran are recorded beside the verdict: the proof that the cap took, and where it did not (fp32
layers OpenVINO hands to MLAS).

What cannot be emulated: ONNX Runtime (MLAS picks its kernels by CPUID, with no cap), a class with instructions this
CPU lacks, and speed (a capped kernel on this core is not the other CPU's). Those are re-validated at the first load
on a CPU of that class, as before; the emulated verdicts are a warning ahead of it, not a substitute.

    python -m kiln.artifact.emulation <artifact> <class> <variant> [<variant> ...]   # in a capped process: JSON
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from kiln.artifact.cpu_pick import CLASS_OVERRIDE, last_line
from kiln.artifact.manifest import Manifest, seal
from kiln.records.artifact import Status
from kiln.system.cpu import ONEDNN_ISA, CpuInfo, emulable_classes

ISA_ENV = "ONEDNN_MAX_CPU_ISA"
CAPPED_ENGINES = ("openvino",)  # engines built on oneDNN's CPU kernels, which honour the cap
TIMEOUT_S = 1800  # one class's checks: every OpenVINO variant judged and timed on the stored inputs
GEMM_LAYERS = ("FullyConnected", "MatMul", "Convolution")
# OpenVINO runs some fp32 FullyConnected layers on MLAS (gemm_mlas_f32), which picks its kernels by CPUID like ONNX
# Runtime: those are not capped, and the record says how many there were (tiny BERT fp32: 8 of 12; MiniLM's int8 IR
# ran all 35 of its int8 MatMuls on oneDNN).
UNCAPPED = "mlas"


def emulate(stage: Path, manifest: Manifest, classes: Sequence[str], cpu: CpuInfo,
            progress: Callable[[str], None] = lambda _: None) -> dict[str, dict[str, Any]]:
    """Each of ``classes`` this CPU can be capped to -> {"isa", "variants": {name: verdict and kernels}} or
    {"isa", "error"}; {} when there is nothing to cap (no such class, or no OpenVINO variant: nothing else here
    honours the cap). Otherwise ``stage`` is sealed with ``manifest`` first: the capped processes open it. A variant
    OpenVINO cannot run under the cap has {"accepted": False, "error"} (MiniLM's bf16-hinted int8 IR under AVX2:
    "Supported primitive descriptors list is empty for node: Softmax")."""
    wanted = [c for c in classes if c in emulable_classes(cpu)]
    # Rejected ones too: a variant can fail here on this class's kernels alone (MiniLM's openvino-int8-static with
    # bf16 float ops: min cosine 0.71 on the AMX Xeon, 0.982 capped to AVX512_CORE_VNNI).
    names = [n for n, r in manifest.variants.items()
             if r.status in (Status.ACCEPTED, Status.REJECTED) and r.engine in CAPPED_ENGINES
             and (stage / r.path).exists()]
    if not wanted or not names or manifest.build.agreement_inputs is None:
        return {}
    seal(stage, manifest)
    out: dict[str, dict[str, Any]] = {}
    for c in wanted:
        isa = ONEDNN_ISA[c]
        progress(f"--for {c}: judging {', '.join(names)} with oneDNN capped to {isa}")
        env = {**os.environ, ISA_ENV: isa, CLASS_OVERRIDE: c}
        try:
            run = subprocess.run([sys.executable, "-m", "kiln.artifact.emulation", str(stage), c, *names], env=env,
                                 capture_output=True, text=True, timeout=TIMEOUT_S)
        except subprocess.TimeoutExpired:
            out[c] = {"isa": isa, "error": f"the capped checks did not finish within {TIMEOUT_S} s"}
            continue
        if run.returncode != 0:
            out[c] = {"isa": isa, "error": last_line(run.stderr, f"exit status {run.returncode}")}
        else:
            out[c] = {"isa": isa, "variants": json.loads(run.stdout)}
        progress(f"--for {c}: {describe(out[c])}")
    return out


def describe(run: dict[str, Any]) -> str:
    """One line per class: each variant's verdict under the cap and the kernels its MatMuls ran."""
    if "error" in run:
        return f"not judged ({run['error']})"
    return "; ".join(f"{name}: does not run under the cap ({v['error']})" if "error" in v else
                     f"{name}: {v['reason']} (kernels: {kernel_list(v['kernels'])})"
                     for name, v in run["variants"].items())


def kernel_list(found: dict[str, int]) -> str:
    """``kernels``' counts as a line, with how many ran on MLAS (not capped)."""
    uncapped = sum(n for k, n in found.items() if UNCAPPED in k)
    said = ", ".join(f"{k} x{n}" for k, n in found.items())
    return f"{said}; {uncapped} on MLAS, which ignores the cap" if uncapped else said


def kernels(predictor: Any) -> dict[str, Any]:
    """How many of the compiled model's MatMul-like layers ran on each oneDNN kernel (OpenVINO's runtime model, read
    after the predictor ran: a dynamic shape's kernels are chosen at its first inference)."""
    engine = predictor.engine
    while not hasattr(engine, "compiled_model"):  # a decoder's teacher-forced view, a row-by-row wrapper
        engine = getattr(engine, "step_engine", None) or engine.engine
    ops = engine.compiled_model.get_runtime_model().get_ops()
    found = Counter(op.get_rt_info()["primitiveType"].astype(str) for op in ops
                    if op.get_rt_info()["layerType"].astype(str) in GEMM_LAYERS)
    return {"kernels": dict(found.most_common())}


def _judge_capped(path: Path, cls: str, names: Sequence[str]) -> dict[str, Any]:
    """In the capped process: cpu_pick's checks of ``names``, each with the kernels it ran. OpenVINO's errors (kiln's
    engine names the file) are a variant's verdict: a layer with no kernel under the cap fails that variant alone."""
    from kiln.artifact.cpu_pick import judge_variants
    from kiln.artifact.directory import Artifact
    from kiln.errors import ArtifactError

    return judge_variants(Artifact.open(path), names, cls, evidence=kernels,
                          verdict_errors=(RuntimeError, ArtifactError))


if __name__ == "__main__":
    if ISA_ENV not in os.environ:
        sys.exit(f"{ISA_ENV} is not set: run through kiln.artifact.emulation.emulate")
    print(json.dumps(_judge_capped(Path(sys.argv[1]), sys.argv[2], sys.argv[3:])))
