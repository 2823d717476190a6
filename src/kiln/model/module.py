"""A positional-input view of a transformers model, shared by export, tracing and the torch engine.

transformers 5 models take keyword arguments and return ModelOutput objects; exporters and tracers want
positional tensors in and a tuple out. The same wrapper is used for every consumer so they compute the
same function.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from kiln.errors import ArtifactError
from kiln.model.heads import OUTPUTS, graph_head
from kiln.model.layout import save_model
from kiln.model.masks import mask_builder
from kiln.model.projected import EncoderWithModules

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
                 cast_inputs: bool = False, head: str = OUTPUTS) -> None:
        """``head`` names what computes the graph's outputs from the model's (kiln.model.heads: a task's
        ``graph_head``); by default the outputs named ``output_names`` are returned as the model gives them."""
        super().__init__()
        self.model = model
        self.input_names = tuple(input_names)
        self.output_names = tuple(output_names)
        self.head_name = head
        self.head = graph_head(head)
        # int32 graph inputs are cast to int64 inside the graph: embeddings and masks then see what they expect.
        self.cast_inputs = cast_inputs
        # Attention masks kiln builds itself where transformers' own do not trace (kiln.model.masks).
        self.masks = mask_builder(getattr(model, "config", None))
        self.eval()  # exporters restore the training flag they found; it must be False

    def forward(self, *inputs: torch.Tensor) -> tuple[torch.Tensor, ...]:
        kwargs = {n: (x.long() if self.cast_inputs else x) for n, x in zip(self.input_names, inputs)}
        given = kwargs
        if self.masks is not None and "attention_mask" in kwargs:
            given = {**kwargs, "attention_mask": self.masks(self.model.config, kwargs["attention_mask"],
                                                            getattr(self.model, "dtype", torch.float32))}
        outputs = self.model(**given, return_dict=True)
        if self.head is not None:
            return self.head(outputs, kwargs)
        return tuple(outputs[n] for n in self.output_names)


# Beside a saved encoder: the weights of the modules kiln runs around it (kiln.model.projected.EncoderWithModules).
SIDE_MODULES_FILE = "kiln_side_modules.safetensors"


def save_task_module(module: TaskModule, directory: Path, task: str) -> None:
    """Save weights (safetensors) and config so :func:`load_task_module` can rebuild the same module: the model
    class and the graph head are recorded by name, so loading needs no task code. An encoder with modules beside it
    (EmbeddingGemma's projections, BGE-M3's heads) saves the encoder as transformers does, the side modules' weights
    in SIDE_MODULES_FILE, and the wrapper's class and shapes in the I/O file."""
    from safetensors.torch import save_file

    model, wrapper = module.model, {}
    if isinstance(model, EncoderWithModules):
        cls = type(model)
        wrapper = {"wrapper": {"class": f"{cls.__module__}:{cls.__qualname__}", **model.described()}}
        save_file(model.side_state(), str(directory / SIDE_MODULES_FILE), metadata={"format": "pt"})
        model = model.encoder
    save_model(model, directory)
    (directory / IO_FILE).write_text(json.dumps(
        {"task": task, "model_class": type(model).__name__, "head": module.head_name,
         "inputs": list(module.input_names), "outputs": list(module.output_names), **wrapper}
    ))


def _wrapped(model: Any, directory: Path, described: dict[str, Any]) -> Any:
    """``model`` inside the recorded wrapper, its side modules' weights loaded (strictly: each one, no other)."""
    import importlib

    from safetensors.torch import load_file

    module_name, _, name = str(described["class"]).partition(":")
    if not module_name.startswith("kiln.model."):  # the I/O file names kiln's own classes only; nothing else runs
        raise ValueError(f"wrapper class {described['class']!r} is not one of kiln.model's")
    cls = getattr(importlib.import_module(module_name), name)
    if not (isinstance(cls, type) and issubclass(cls, EncoderWithModules)):
        raise ValueError(f"{described['class']} is not an encoder with modules beside it")
    wrapper = cls.rebuilt(model, described)
    try:
        side = load_file(str(directory / SIDE_MODULES_FILE))
    except Exception as err:  # safetensors' own error type on a damaged file: one message naming the file
        raise ValueError(f"{SIDE_MODULES_FILE} cannot be read ({err})") from err
    missing, unexpected = wrapper.load_state_dict(side, strict=False)
    missing = [k for k in missing if not k.startswith("encoder.")]
    if missing or unexpected:
        raise ValueError(f"{SIDE_MODULES_FILE} does not fit {name} (missing {missing}, unexpected {unexpected})")
    return wrapper


# Variants saved before the I/O file named its head: the one head kiln had then, known by the output it makes.
_LEGACY_HEADS = {("sparse_embedding",): "sparse-max-pool"}


def load_task_module(directory: Path) -> TaskModule:
    import transformers

    try:
        io = json.loads((directory / IO_FILE).read_text())
        # Older variants: the class transformers itself recorded in config.json (save_pretrained writes it).
        model_class = io.get("model_class") or json.loads((directory / "config.json").read_text())["architectures"][0]
        model = getattr(transformers, model_class).from_pretrained(directory)
        if "wrapper" in io:
            model = _wrapped(model, directory, io["wrapper"])
        head = io.get("head", _LEGACY_HEADS.get(tuple(io["outputs"]), OUTPUTS))
    except (OSError, ValueError, KeyError, IndexError, AttributeError, RuntimeError) as err:
        raise ArtifactError(f"cannot load the PyTorch variant in {directory}: {err}") from err
    return TaskModule(model.eval(), tuple(io["inputs"]), tuple(io["outputs"]), head=head)
