"""Passes that stay in PyTorch: weights for autocast variants, and torch.ao dynamic int8."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import torch

from kiln.exporting.torchscript import export_torchscript
from kiln.model.module import TaskModule, save_task_module
from kiln.source.loading import SourceModel


def save_weights(source: SourceModel, module: TaskModule, directory: Path) -> dict[str, Any]:
    """The original fp32 weights (safetensors) that the torch-bf16 / torch-fp16 autocast variants load."""
    save_task_module(module, directory, source.task_config.task)
    return {"pass": "save-torch", "weights": "fp32 safetensors"}


def quantize_dynamic_int8(module: TaskModule, example: tuple[torch.Tensor, ...], path: Path) -> dict[str, Any]:
    """torch.ao dynamic int8 on every Linear, then traced and frozen (quantized modules do not save as
    safetensors; TorchScript keeps their packed weights)."""
    import copy

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch.ao.quantization is deprecated in favour of torchao
        quantized = torch.ao.quantization.quantize_dynamic(copy.deepcopy(module), {torch.nn.Linear},
                                                           dtype=torch.qint8)
    export_torchscript(quantized, example, path)
    return {"pass": "torch-int8-dynamic", "modules": "Linear", "dtype": "qint8"}
