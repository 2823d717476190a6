"""A positional-input view of a transformers model, shared by export, tracing and the torch engine.

transformers 5 models take keyword arguments and return ModelOutput objects; exporters and tracers want
positional tensors in and a tuple out. The same wrapper is used for every consumer so they compute the
same function.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from kiln.errors import ArtifactError

# The one spelling of the I/O description file: beside saved weights, and inside TorchScript archives.
IO_FILE = "kiln_io.json"


def placed_on(module: torch.nn.Module, device: str) -> torch.nn.Module:
    """``module`` on ``device``: moved there itself for the CPU, else a copy moved there, so the caller's module
    (kiln optimize's, which later exports read) stays on the CPU. ``Module.to`` moves in place."""
    if torch.device(device).type == "cpu":
        return module.to(device)
    import copy

    return copy.deepcopy(module).to(device)


class TaskModule(torch.nn.Module):
    def __init__(self, model: Any, input_names: tuple[str, ...], output_names: tuple[str, ...],
                 cast_inputs: bool = False, head: Callable[[Any, dict[str, Any]], tuple[Any, ...]] | None = None,
                 ) -> None:
        """``head(model outputs, inputs)`` computes the graph's outputs (a task's ``graph_outputs``); without it
        the outputs named ``output_names`` are returned as the model gives them."""
        super().__init__()
        self.model = model
        self.input_names = tuple(input_names)
        self.output_names = tuple(output_names)
        self.head = head
        # int32 graph inputs are cast to int64 inside the graph: embeddings and masks then see what they expect.
        self.cast_inputs = cast_inputs
        self.eval()  # exporters restore the training flag they found; it must be False

    def forward(self, *inputs: torch.Tensor) -> tuple[torch.Tensor, ...]:
        kwargs = {n: (x.long() if self.cast_inputs else x) for n, x in zip(self.input_names, inputs)}
        outputs = self.model(**kwargs, return_dict=True)
        if self.head is not None:
            return self.head(outputs, kwargs)
        return tuple(outputs[n] for n in self.output_names)


def save_task_module(module: TaskModule, directory: Path, task: str) -> None:
    """Save weights (safetensors) and config so :func:`load_task_module` can rebuild the same module."""
    module.model.save_pretrained(directory, safe_serialization=True)
    (directory / IO_FILE).write_text(json.dumps(
        {"task": task, "inputs": list(module.input_names), "outputs": list(module.output_names)}
    ))


def load_task_module(directory: Path) -> TaskModule:
    import transformers

    from kiln.tasks import task_spec

    try:
        io = json.loads((directory / IO_FILE).read_text())
        spec = task_spec(io["task"])
        model = getattr(transformers, spec.auto_class).from_pretrained(directory)
    except (OSError, ValueError, KeyError) as err:
        raise ArtifactError(f"cannot load the PyTorch variant in {directory}: {err}") from err
    return TaskModule(model.eval(), tuple(io["inputs"]), tuple(io["outputs"]), head=spec.graph_outputs)
