"""Labelled evaluation files: the task spec parses the rows; errors name the file and line."""

from __future__ import annotations

from pathlib import Path

from kiln.errors import UsageError
from kiln.records.figures import EvalSet
from kiln.tasks import task_spec


def load_eval_set(path: Path, task: str) -> EvalSet:
    """Read ``path`` for ``task``: JSONL and CSV with the task's fields, or the task's own formats."""
    path = Path(path).expanduser()
    if not path.is_file():
        raise UsageError(f"eval_file file {path} does not exist")
    data = task_spec(task).validation.read_eval(path)
    if not len(data):
        raise UsageError(f"eval_file file {path} has no examples")
    return data
