"""The wire parts of the tasks (``kiln.tasks.<name>.wire``), found by convention: a task's wire part is the
``wire`` module beside its compute module, and that module's ``WIRE`` class. A task without one gets
:class:`TaskWire`'s defaults (no route; JSON per input on Triton), so a new task is still one place.

Only kiln.serving and kiln.integrations import this package (pyproject.toml's contracts).
"""

from __future__ import annotations

import functools
import importlib
from enum import Enum

from kiln.tasks import task_spec
from kiln.tasks.base import TaskSpec
from kiln.tasks.wire.base import TaskWire


@functools.cache
def _wire_of(spec: type[TaskSpec]) -> type[TaskWire]:
    package = spec.__module__.rpartition(".")[0]  # "": a task in a top-level module, with no package to hold one
    wire = f"{package}.wire"
    try:
        found: type[TaskWire] | None = importlib.import_module(wire).WIRE if package else None
    except ModuleNotFoundError as e:
        if e.name != wire:
            raise  # the wire module exists and fails to import: a bug to see, not a task without routes
        found = None
    return found or type(f"{spec.__name__}Wire", (TaskWire,), {"task": spec})


def task_wire(name: str | Enum) -> type[TaskWire]:
    """The wire part of the task registered as ``name`` (a UsageError lists the tasks there are)."""
    return _wire_of(task_spec(name))


__all__ = ["TaskWire", "task_wire"]
