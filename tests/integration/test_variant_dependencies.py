"""A variant that fails takes the variants built from its files along as *skipped*, naming it, and the command's
error leads with the first cause (a PyLate 1.2.0 ColBERT's onnx-fp32 failing its check made every later variant
fail with "No such file or directory: .../onnx-fp32/model.onnx", and the command end on ONNX Runtime's
NO_SUCHFILE). The failure is injected into onnx-fp32's check."""

from __future__ import annotations

import pytest

import kiln.optimizing.job as job_module
from kiln.optimizing.job import NothingPassed, OptimizeConfig, OptimizeJob, Status
from kiln.tasks import TaskName

CAUSE = "operands could not be broadcast together with shapes (4096,) (5120,)"


@pytest.fixture
def first_check_breaks(monkeypatch):
    real, calls = job_module.measure_batchings, []

    def measure(*args, **kwargs):
        calls.append(1)
        if len(calls) == 1:  # the first variant checked: onnx-fp32
            raise ValueError(CAUSE)
        return real(*args, **kwargs)

    monkeypatch.setattr(job_module, "measure_batchings", measure)


def test_variants_built_from_a_failed_one_are_skipped_naming_it(tiny_model, tmp_path, first_check_breaks):
    variants = ("onnx-fp32", "onnx-fused", "onnx-int8-dynamic", "openvino-fp32", "torchscript")
    summary = OptimizeJob(OptimizeConfig(model=str(tiny_model("bert")), task=TaskName.FEATURE_EXTRACTION,
                                         output=tmp_path / "out", variants=variants)).run()
    by_name = {o.name: o for o in summary.outcomes}
    assert by_name["onnx-fp32"].status is Status.FAILED and CAUSE in by_name["onnx-fp32"].reason
    for name in ("onnx-fused", "onnx-int8-dynamic", "openvino-fp32"):
        assert by_name[name].status is Status.SKIPPED, by_name[name]
        assert by_name[name].reason == f"onnx-fp32 failed, and {name} is built from it"
    assert by_name["torchscript"].status is Status.ACCEPTED and summary.best == "torchscript"  # not built from it
    assert not any((tmp_path / "out" / name).exists() for name in variants[:4])


def test_the_command_ends_on_the_first_cause(tiny_model, tmp_path, first_check_breaks):
    with pytest.raises(NothingPassed) as raised:
        OptimizeJob(OptimizeConfig(model=str(tiny_model("bert")), task=TaskName.FEATURE_EXTRACTION,
                                   output=tmp_path / "out", variants=("onnx-fp32", "onnx-fused"))).run()
    message = str(raised.value)
    assert message.startswith(f"no variant passed the gate; first, onnx-fp32 failed: ValueError: {CAUSE}")
    assert "No such file" not in message and "onnx-fused skipped: onnx-fp32 failed" in message


def test_a_failure_on_a_full_disk_names_the_disk(tiny_model, tmp_path, monkeypatch):
    """A native library reports a full disk in its own words (OpenVINO's save_model: "basic_ios::clear: iostream
    error"); the failure carries the free space kiln measured. The write error and the full disk are injected."""
    import collections
    import shutil

    import openvino

    def save_model(*args, **kwargs):
        raise RuntimeError("basic_ios::clear: iostream error")

    usage = collections.namedtuple("usage", "total used free")
    monkeypatch.setattr(openvino, "save_model", save_model)
    monkeypatch.setattr(shutil, "disk_usage", lambda path: usage(10 * 2**30, 10 * 2**30 - 3 * 2**20, 3 * 2**20))
    summary = OptimizeJob(OptimizeConfig(model=str(tiny_model("bert")), task=TaskName.FEATURE_EXTRACTION,
                                         output=tmp_path / "out", variants=("onnx-fp32", "openvino-fp32"))).run()
    failed = {o.name: o for o in summary.outcomes}["openvino-fp32"]
    assert failed.status is Status.FAILED
    assert "iostream error (the disk holding" in failed.reason and "had 3 MiB free when it failed" in failed.reason
