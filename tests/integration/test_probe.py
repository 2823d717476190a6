"""A runtime that dies in native code while loading a variant ends a child process, not kiln optimize.

The crash is injected: the probe's child loop is replaced by one that kills itself with SIGFPE, as OpenVINO
2026.4.1's CPU plugin does compiling a rotary encoder for bf16 on one thread (kiln.engines.probe)."""

from __future__ import annotations

import os
import signal

import pytest

from kiln.engines.base import EngineOptions
from kiln.engines.probe import EngineProbe
from kiln.optimizing.job import OptimizeConfig, OptimizeJob, Status
from kiln.tasks import TaskName


def _dies_of_sigfpe(conn) -> None:
    conn.recv()
    os.kill(os.getpid(), signal.SIGFPE)


def test_a_crash_is_named_and_the_next_probe_starts_a_new_child(tiny_model, tmp_path):
    from kiln.choices import ExportFormat
    from kiln.exporting.job import ExportConfig, run_export

    run_export(ExportConfig(model=str(tiny_model("bert")), task="feature-extraction", format=ExportFormat.ONNX,
                            output=tmp_path / "export"))
    model = tmp_path / "export" / "onnx-fp32" / "model.onnx"
    crashing = EngineProbe(serve=_dies_of_sigfpe)
    try:
        first = crashing.crash("onnxruntime", model, EngineOptions(intra_op_threads=1))
        assert first is not None and "signal 8 (SIGFPE)" in first and "onnxruntime crashed loading it" in first
        # answered from what it learnt, without a child; other options start a new one (which dies again)
        assert crashing.crash("onnxruntime", model, EngineOptions(intra_op_threads=1)) == first
        assert "SIGFPE" in crashing.crash("onnxruntime", model, EngineOptions(intra_op_threads=2))
    finally:
        crashing.close()
    real = EngineProbe()
    try:  # the real child loads it; a load that raises is left to the caller (it raises the same error itself)
        assert real.crash("onnxruntime", model, EngineOptions(intra_op_threads=1)) is None
        assert real.crash("onnxruntime", tmp_path / "missing.onnx", EngineOptions(intra_op_threads=1)) is None
    finally:
        real.close()


def test_optimize_reports_the_crashing_variant_failed_and_keeps_the_others(tiny_model, tmp_path):
    pytest.importorskip("openvino")
    job = OptimizeJob(OptimizeConfig(model=str(tiny_model("bert")), task=TaskName.FEATURE_EXTRACTION,
                                     output=tmp_path / "out", variants=("onnx-fp32", "openvino-fp32")))
    job.probe = EngineProbe(serve=_dies_of_sigfpe)
    summary = job.run()
    by_name = {o.name: o for o in summary.outcomes}
    assert by_name["onnx-fp32"].status is Status.ACCEPTED and summary.best == "onnx-fp32"
    crashed = by_name["openvino-fp32"]
    assert crashed.status is Status.FAILED
    assert "NativeCrashError: openvino crashed loading it" in crashed.reason and "SIGFPE" in crashed.reason
    assert not (tmp_path / "out" / "openvino-fp32").exists()  # a failed variant leaves no files
