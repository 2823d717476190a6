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
    package = spec.__module__.rpartition(".")[0]
    if not package:  # a task defined in a top-level module has no package to hold a wire part
        return type(f"{spec.__name__}Wire", (TaskWire,), {"task": spec})
    try:
        module = importlib.import_module(f"{package}.wire")
    except ModuleNotFoundError as e:
        if e.name != f"{package}.wire":
            raise  # the wire module exists and fails to import: a bug to see, not a task without routes
        return type(f"{spec.__name__}Wire", (TaskWire,), {"task": spec})
    wire: type[TaskWire] = module.WIRE
    return wire


def task_wire(name: str | Enum) -> type[TaskWire]:
    """The wire part of the task registered as ``name`` (a UsageError lists the tasks there are)."""
    return _wire_of(task_spec(name))


__all__ = ["TaskWire", "task_wire"]
