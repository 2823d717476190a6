"""One place per task: nothing outside kiln.tasks names a task, every task declares what kiln needs, and every named
choice is defined once with the registries following it."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import kiln
from kiln.tasks import TASKS, TaskName
from kiln.tasks.wire import task_wire

SRC = Path(kiln.__file__).parent


def _names_a_task(path: Path) -> list[str]:
    """String constants holding a registered task name, and TaskName.<MEMBER> uses, in one module."""
    members = {m.name for m in TaskName}
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            found += [f"{path.name}:{node.lineno}: {name!r}" for name in TASKS if name in node.value]
        if isinstance(node, ast.Attribute) and node.attr in members:
            found.append(f"{path.name}:{node.lineno}: .{node.attr}")
    return found


def test_no_module_outside_tasks_names_a_task():
    """kiln.testing is left out: like a test, it builds a model for a named task (kiln itself never imports it)."""
    modules = [p for p in SRC.rglob("*.py") if not {"tasks", "testing"} & set(p.relative_to(SRC).parts)]
    assert len(modules) > 40
    offenders = [hit for path in modules for hit in _names_a_task(path)]
    assert not offenders, offenders


def test_the_check_finds_a_task_name(tmp_path):
    """The check above can fail: a module that branches on a task name is found."""
    bad = tmp_path / "bad.py"
    bad.write_text('def f(task):\n    return task == "question-answering" or task is TaskName.FEATURE_EXTRACTION\n')
    assert len(_names_a_task(bad)) == 2


def test_every_task_declares_what_kiln_needs():
    for name, spec in TASKS.items():
        assert spec.name == name and spec.export.auto_class.startswith("AutoModel")
        assert set(spec.export.sequence_outputs) <= set(spec.export.output_names)
        judge = spec.validation
        assert judge.name == name and 0 < judge.default_tolerance < 1 and judge.tolerance_help and judge.metric
        assert judge.eval_fields
        wire = task_wire(name)
        assert wire.task is spec and wire.routes, name  # every shipped task is served, by its own wire part


def test_the_top_level_holds_only_shared_pieces():
    """The stages live in folders (model/, export/, optimize/, …); the top level keeps what every stage shares:
    named choices, errors, logging and the scores of outputs (the typed records are a folder of their own)."""
    assert sorted(p.name for p in SRC.glob("*.py")) == ["__init__.py", "__main__.py", "choices.py", "errors.py",
                                                        "log.py", "scoring.py"]
    assert {"load", "Artifact", "Predictor", "TaskName", "TextPair"} <= set(kiln.__all__)


def test_choices_are_named_once_and_the_registries_follow_them():
    """Every variant builder has a VariantName (so --variants help lists them all) and every device, target,
    calibration method and scope the config records accept is the enum's own vocabulary."""
    from kiln.choices import CalibrationMethod, Device, PruneScope, Target, VariantName
    from kiln.cli.app import app
    from kiln.engines.base import EngineOptions
    from kiln.errors import UsageError
    from kiln.optimizing.variants import VARIANTS

    assert set(VARIANTS) == set(VariantName)
    assert f"{Target.CUDA}" == "cuda" and Device.TENSORRT == "tensorrt"
    with pytest.raises(UsageError, match="device must be one of: cpu, cuda, tensorrt .got 'gpu'."):
        EngineOptions(device="gpu")
    assert EngineOptions(device="cuda").device is Device.CUDA
    import typer

    params = {p.name: p for p in typer.main.get_command(app).commands["optimize"].params}
    assert "openvino-int8-weights" in params["variants"].help  # generated from the registry's names
    from typer.testing import CliRunner

    for flag, enum in (("--calibration-method", CalibrationMethod), ("--target", Target)):
        refused = CliRunner().invoke(app, ["optimize", flag, "nonsense"], env={"COLUMNS": "300"})
        assert refused.exit_code == 2 and all(m.value in refused.output for m in enum), refused.output
    assert {m.value for m in PruneScope} == {"global", "layer"}
