"""`kiln doctor`: what this machine offers kiln, and what would silently go wrong."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kiln.system.cpu import cpu_info, int8_scheme
from kiln.system.versions import library_versions


@dataclass
class Finding:
    level: str  # ok | warn
    message: str


@dataclass
class Report:
    sections: dict[str, dict[str, Any]] = field(default_factory=dict)
    findings: list[Finding] = field(default_factory=list)


def _providers(report: Report) -> None:
    try:
        import onnxruntime as ort
    except ImportError as err:
        report.findings.append(Finding("warn", f"onnxruntime is not importable: {err}"))
        return
    available = ort.get_available_providers()
    usable = {}
    for provider in available:
        usable[provider] = _provider_works(ort, provider)
        if provider != "CPUExecutionProvider" and not usable[provider]:
            report.findings.append(Finding("warn", f"{provider} is listed but a session falls back to CPU "
                                           "(driver, CUDA or cuDNN libraries missing): GPU runs would be CPU runs"))
    report.sections["onnxruntime"] = {"version": ort.__version__, "providers_listed": available,
                                      "providers_usable": [p for p, ok in usable.items() if ok]}


# A one-node ONNX graph (y = Relu(x)), shipped as a file so that a serving install (no onnx package) can probe its
# providers too; tests/unit/test_doctor.py checks it is exactly what probe_model() builds with onnx.
PROBE_FILE = Path(__file__).resolve().parents[1] / "data" / "probe-relu.onnx"


def probe_model() -> bytes:
    """The probe graph, built with the onnx package (as PROBE_FILE was written)."""
    from onnx import TensorProto, helper

    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "probe",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], producer_name="kiln-doctor")
    model.ir_version = 9
    return model.SerializeToString()


def _provider_works(ort, provider: str) -> bool:
    """Create a one-node session on ``provider`` and check ONNX Runtime kept it (no silent CPU fallback)."""
    try:
        session = ort.InferenceSession(PROBE_FILE.read_bytes(), providers=[provider])
    except Exception:  # a provider that cannot even create a session is simply not usable
        return False
    return session.get_providers()[0] == provider


def _openvino(report: Report) -> None:
    try:
        import openvino as ov
    except ImportError:
        report.sections["openvino"] = {"installed": False, "hint": "pip install 'kiln[openvino]'"}
        return
    core = ov.Core()
    report.sections["openvino"] = {"version": ov.__version__, "devices": core.available_devices,
                                   "cpu_capabilities": list(core.get_property("CPU", "OPTIMIZATION_CAPABILITIES"))}


def diagnose(threads: int | None = None) -> Report:
    report = Report()
    cpu = cpu_info()
    scheme = int8_scheme(cpu)
    report.sections["cpu"] = {"model": cpu.model, "arch": cpu.arch, "features": list(cpu.features),
                              "vnni": cpu.has_vnni, "bf16": cpu.has_bf16,
                              "int8_scheme": ("S8" if scheme.weights_signed else "U8") + " weights, "
                              + ("S8" if scheme.activations_signed else "U8") + " activations"
                              + (", 7-bit weights (reduce_range)" if scheme.reduce_range else ""),
                              "int8_reason": scheme.reason}
    wanted = threads or cpu.usable_cores
    report.sections["threads"] = {"logical_cores": cpu.logical_cores, "usable_cores": cpu.usable_cores,
                                  "kiln_threads": wanted}
    if wanted > cpu.usable_cores:
        report.findings.append(Finding("warn", f"{wanted} threads requested but only {cpu.usable_cores} cores are "
                                       "usable (affinity / cgroup quota): threads would contend"))
    if not cpu.has_vnni and cpu.arch not in ("aarch64", "arm64"):
        report.findings.append(Finding("warn", "no VNNI: int8 GEMMs run on slower AVX2 paths; expect smaller "
                                       "int8 speed-ups. ONNX Runtime's AVX2 u8s8 kernels (7-bit weights) still pay; "
                                       "OpenVINO's int8 does not (no fast int8 kernel without VNNI/AMX), so kiln "
                                       "optimize leaves openvino-int8-static out of its defaults here"))
    _providers(report)
    _openvino(report)
    report.sections["versions"] = library_versions()
    return report
