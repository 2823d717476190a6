"""A task's wire part: what the servers and Triton need to speak its requests and answers.

The task's compute (``kiln.tasks.<name>.task``) knows nothing of HTTP, pydantic or Triton; its wire part
(``kiln.tasks.<name>.wire``) declares the routes kiln serve mounts, the ``kiln.pipeline`` adapter, and the
Triton / KServe v2 tensors. Only ``kiln.serving`` and ``kiln.integrations`` import wire parts (a contract in
pyproject.toml refuses the rest), so loading or validating a model never loads pydantic's request models.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

if TYPE_CHECKING:
    from kiln.tasks.base import TaskSpec
    from kiln.tasks.wire.http import Route


class TaskWire:
    """Base of every task's wire part; a task without one (``TaskWire`` itself) is served by no route and
    answers Triton with one JSON string per input."""

    task: ClassVar[type[TaskSpec]]
    routes: ClassVar[tuple[Route, ...]] = ()
    # kiln.pipeline's adapter (predictor, **kwargs) -> callable, for a task transformers does not ship a pipeline for.
    pipeline: ClassVar[Any] = None
    # `kiln triton` and KServe v2: the ensemble's string inputs (one per request row), its outputs (name, Triton data
    # type, dims without the batch axis), and whether one input becomes several windows (then every token tensor
    # carries a windows axis after the batch axis, and the model step flattens it into its engine batch).
    triton_inputs: ClassVar[tuple[str, ...]] = ("TEXT",)
    triton_outputs: ClassVar[tuple[tuple[str, str, tuple[int, ...]], ...]] = (("RESULT", "TYPE_STRING", (1,)),)
    triton_windows: ClassVar[bool] = False

    @classmethod
    def triton_refusal(cls) -> str | None:
        """Why kiln triton cannot write this task's ensemble, or None when it can."""
        return None

    @classmethod
    def triton_items(cls, columns: Mapping[str, list[str]]) -> list[Any]:
        """The task's inputs from the ensemble's string inputs (one list per name in ``triton_inputs``)."""
        return list(columns["TEXT"])

    @classmethod
    def triton_arrays(cls, results: Sequence[Any]) -> dict[str, np.ndarray]:
        """One request's results as the arrays of ``triton_outputs`` (batch axis first): JSON per input here."""
        from kiln.records import to_jsonable

        return {"RESULT": np.array([[json.dumps(to_jsonable(r)).encode()] for r in results], dtype=object)}
