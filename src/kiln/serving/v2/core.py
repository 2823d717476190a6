"""What both v2 transports share: a served model's tensor metadata, one inference call, its errors.

A v2 error is an :class:`~kiln.serving.endpoints.HTTPError`: each transport turns its status into its own shape
(HTTP: ``{"error": message}`` with the status; gRPC: the matching status code).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from kiln.serving.endpoints import HTTPError, not_ready
from kiln.serving.inference import Served, infer
from kiln.tasks.wire import task_wire

VERSION = "1"  # kiln serves one version of each model; v2 clients may name it or leave it out
# Triton config data types (the wire parts' triton_outputs) -> v2 data types, and v2 -> numpy.
DATATYPES = {"TYPE_FP32": "FP32", "TYPE_STRING": "BYTES", "TYPE_INT64": "INT64", "TYPE_INT32": "INT32"}
NUMPY = {"FP32": np.float32, "FP64": np.float64, "INT64": np.int64, "INT32": np.int32, "BYTES": np.object_}


@dataclass(frozen=True)
class TensorMeta:
    name: str
    datatype: str
    shape: tuple[int, ...]  # -1 for the batch axis

    def describe(self) -> dict[str, Any]:
        return {"name": self.name, "datatype": self.datatype, "shape": list(self.shape)}


@dataclass(frozen=True)
class InferCall:
    """One v2 inference request, transport aside: each input tensor as one string per row."""

    model: str
    version: str | None
    columns: Mapping[str, list[str]]
    outputs: tuple[str, ...] = ()  # requested outputs; empty: all
    id: str = ""
    parameters: Mapping[str, Any] = field(default_factory=dict)


class _Body:
    """An InferCall's rows as the request body kiln's inference path takes (inference.infer)."""

    truncate = True  # v2 has no truncate flag; inputs past the model's maximum are cut, as Triton's steps do

    def __init__(self, items: list[Any]) -> None:
        self._items = items

    def items(self) -> list[Any]:
        return self._items

    def input_count(self) -> int:
        return len(self._items)

    def options(self) -> dict[str, Any]:
        return {}


def tensors(task: str) -> tuple[tuple[TensorMeta, ...], tuple[TensorMeta, ...]]:
    """The model's (inputs, outputs): BYTES [-1, 1] per string input, the task's outputs with a batch axis."""
    wire = task_wire(task)
    inputs = tuple(TensorMeta(name, "BYTES", (-1, 1)) for name in wire.triton_inputs)
    outputs = tuple(TensorMeta(name, DATATYPES[kind], (-1, *dims)) for name, kind, dims in wire.triton_outputs)
    return inputs, outputs


def v2_refusal(task: str) -> str | None:
    """Why a model of ``task`` has no v2 tensors (a decoder), or None."""
    return task_wire(task).triton_refusal()


def served_model(models: Mapping[str, Served], name: str, version: str | None, *, ready: bool = True) -> Served:
    """The served model a v2 path names, or the v2 error: 404 unknown model or version (or one with no v2
    tensors), 503 not ready."""
    if name not in models:
        raise HTTPError(404, "model_not_found", f"unknown model {name!r} (served: {', '.join(models)})")
    if version not in (None, "", VERSION):
        raise HTTPError(404, "model_not_found", f"model {name!r} has version {VERSION} only (asked for {version!r})")
    refusal = v2_refusal(models[name].task)
    if refusal:  # not a v2 model at all (a decoder, a multi-vector model): not found in the v2 repository
        raise HTTPError(404, "model_not_found", f"model {name!r} is not served over v2 (it has no v2 tensors: "
                        f"{refusal}); use its kiln routes")
    if ready:
        error = not_ready({name: models[name]})
        if error is not None:
            raise error
    return models[name]


def metadata(served: Served) -> dict[str, Any]:
    inputs, outputs = tensors(served.task)
    platform = f"kiln_{served.artifact.variant(served.variant).engine}"
    return {"name": served.name, "versions": [VERSION], "platform": platform,
            "inputs": [t.describe() for t in inputs], "outputs": [t.describe() for t in outputs]}


def server_metadata(extensions: Sequence[str]) -> dict[str, Any]:
    from kiln import __version__

    return {"name": "kiln", "version": __version__, "extensions": list(extensions)}


async def run_infer(app_state: Any, call: InferCall, trace: Any) -> dict[str, np.ndarray]:
    """The call's output arrays (batch axis first), through the model's batcher; HTTPError on a bad call."""
    served = served_model(app_state.models, call.model, call.version)
    wire = task_wire(served.task)
    inputs, outputs = tensors(served.task)
    wanted = [t.name for t in inputs]
    if sorted(call.columns) != sorted(wanted):
        raise HTTPError(400, "invalid_request", f"model {call.model!r} takes inputs {', '.join(wanted)} (BYTES, shape "
                        f"[n, 1]); got {', '.join(call.columns) or 'none'}")
    rows = {len(column) for column in call.columns.values()}
    if len(rows) != 1 or 0 in rows:
        raise HTTPError(400, "invalid_request", f"inputs {', '.join(wanted)} must have the same number of rows, at "
                        f"least one (got {', '.join(f'{n}: {len(c)}' for n, c in call.columns.items())})")
    unknown = [o for o in call.outputs if o not in {t.name for t in outputs}]
    if unknown:
        raise HTTPError(400, "invalid_request", f"model {call.model!r} has no output {', '.join(unknown)} (outputs: "
                        f"{', '.join(t.name for t in outputs)})")
    items = wire.triton_items(call.columns)
    trace.set(model=served.name, task=served.task, variant=served.variant)
    _, results = await infer(served, _Body(items), app_state.pool, app_state.metrics,
                             app_state.config.max_inputs_per_request, trace)
    arrays = wire.triton_arrays(results)
    return {name: array for name, array in arrays.items() if not call.outputs or name in call.outputs}


def datatype(array: np.ndarray) -> str:
    return "BYTES" if array.dtype == np.object_ else {v: k for k, v in NUMPY.items()}[array.dtype.type]
