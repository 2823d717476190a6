"""The inputs optimize works on: the user's files where given, else the task spec's built-in inputs."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from kiln.errors import UsageError
from kiln.records.figures import EvalSet
from kiln.tasks import task_spec
from kiln.validation.evalsets import load_eval_set


def read_inputs(path: Path, task: str, flag: str = "calibration") -> list[Any]:
    """Model inputs from a file: .txt one per line, or an eval-style .jsonl/.csv of the task."""
    path = path.expanduser()
    if not path.is_file():
        raise UsageError(f"{flag} file {path} does not exist")
    spec = task_spec(task)
    if path.suffix.lower() == ".txt":
        inputs = spec.inputs_from_lines([line.strip() for line in path.read_text(encoding="utf-8").splitlines()
                                         if line.strip()], flag)
    else:
        inputs = spec.validation.eval_inputs(load_eval_set(path, task))
    if not inputs:
        raise UsageError(f"{flag} file {path} has no texts")
    return inputs


def eval_set(task: str, path: Path | None) -> EvalSet | None:
    """The labelled data of the task metric: --eval, else what kiln ships for the task (if anything)."""
    return load_eval_set(path, task) if path is not None else task_spec(task).validation.builtin_eval()


def user_inputs(task: str, calibration: list[Any] | None, data: EvalSet | None) -> list[Any] | None:
    """The user's own inputs, to time on: their calibration texts, else the inputs of their eval file."""
    if calibration:
        return calibration
    if data is None or data.builtin:
        return None
    return task_spec(task).validation.eval_inputs(data)


def builtin_calibration(count: int) -> str:
    """How the default calibration set is described wherever a run is summarised."""
    import platform

    from kiln.data import corpus

    return (f"built-in: {count} texts cut from Python {platform.python_version()}'s documentation, calibration "
            f"half (corpus {corpus.fingerprint()}; agreement is measured on the other half). Pass --calibration "
            "FILE with texts like your traffic: int8 ranges follow them")
