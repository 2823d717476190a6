from __future__ import annotations

import os
from pathlib import Path

import pytest

from kiln.tasks import TaskName

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # nothing in the suite may reach the hub
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory):
    """``tiny_model(arch, task)`` -> directory of a tiny random model, built once per session."""
    from kiln.testing.factory import build_tiny_model

    cache: dict[tuple[str, TaskName], Path] = {}

    def get(arch: str = "bert", task: TaskName = TaskName.FEATURE_EXTRACTION) -> Path:
        key = (arch, task)
        if key not in cache:
            cache[key] = build_tiny_model(arch, task, tmp_path_factory.mktemp(f"{arch}-{task.value}"))
        return cache[key]

    return get


@pytest.fixture(scope="session")
def tiny_artifact(tiny_model, tmp_path_factory) -> Path:
    """A tiny BERT feature-extraction model exported to ONNX, shared read-only (copy it before altering it)."""
    from kiln.choices import ExportFormat
    from kiln.exporting.job import ExportConfig, run_export

    out = tmp_path_factory.mktemp("tiny-artifact") / "art"
    run_export(ExportConfig(model=str(tiny_model("bert")), task=TaskName.FEATURE_EXTRACTION,
                            format=ExportFormat.ONNX, output=out))
    return out


@pytest.fixture(scope="session")
def task_artifacts(tiny_model, tiny_artifact, tmp_path_factory) -> dict:
    """A tiny BERT ONNX artifact per task (read-only, shared): {TaskName: directory}."""
    from kiln.choices import ExportFormat
    from kiln.exporting.job import ExportConfig, run_export

    out = {TaskName.FEATURE_EXTRACTION: tiny_artifact}
    from kiln.tasks import task_spec
    from kiln.tasks.generative import GenerativeTask

    for task in TaskName:
        # BERT does not generate (decoders: tests/integration/test_generation.py)
        if task not in out and not issubclass(task_spec(task), GenerativeTask):
            path = tmp_path_factory.mktemp(task.value) / "art"
            run_export(ExportConfig(model=str(tiny_model("bert", task)), task=task, format=ExportFormat.ONNX,
                                    output=path))
            out[task] = path
    return out


@pytest.fixture(scope="session")
def minilm_dir() -> Path:
    from kiln.source.loading import bundled_model_dir

    return bundled_model_dir()


def has_cuda() -> bool:
    try:
        import onnxruntime

        return "CUDAExecutionProvider" in onnxruntime.get_available_providers()
    except ImportError:
        return False


def pytest_collection_modifyitems(config, items):
    if has_cuda():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU with onnxruntime-gpu; none here")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
