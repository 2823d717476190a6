"""`kiln doctor` reports CPU features, the int8 scheme, threads, usable providers and versions."""

from __future__ import annotations

import subprocess
import sys

from kiln.system.cpu import CpuInfo, int8_scheme
from kiln.system.doctor import diagnose


def test_diagnose_sections():
    report = diagnose()
    assert {"cpu", "threads", "onnxruntime", "versions"} <= report.sections.keys()
    assert "CPUExecutionProvider" in report.sections["onnxruntime"]["providers_usable"]
    assert report.sections["threads"]["kiln_threads"] == report.sections["threads"]["usable_cores"]
    assert report.sections["cpu"]["int8_reason"]


def test_too_many_threads_is_a_warning():
    report = diagnose(threads=512)
    assert any("512 threads requested" in f.message for f in report.findings)


def test_int8_scheme_follows_the_instruction_set():
    def cpu(arch: str, *features: str) -> CpuInfo:
        return CpuInfo("test", arch, tuple(features), 2, 2)

    assert int8_scheme(cpu("x86_64", "avx2", "avx512", "avx512-vnni")).reduce_range is False
    no_vnni = int8_scheme(cpu("x86_64", "avx2"))
    assert no_vnni.reduce_range and no_vnni.weights_signed and not no_vnni.activations_signed
    arm = int8_scheme(cpu("aarch64", "dotprod"))
    assert arm.weights_signed and arm.activations_signed
    assert not int8_scheme(cpu("x86_64")).weights_signed


def test_cli_prints_every_section():
    result = subprocess.run([sys.executable, "-m", "kiln", "doctor"], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    for text in ("cpu", "features", "int8_scheme", "usable_cores", "providers_usable", "versions"):
        assert text in result.stdout


def test_the_shipped_provider_probe_is_the_graph_onnx_builds():
    """A serving install has no onnx package, so doctor probes providers with a shipped one-node graph."""
    from kiln.system.doctor import PROBE_FILE, probe_model

    assert PROBE_FILE.read_bytes() == probe_model()
