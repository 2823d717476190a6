"""TorchScript export: trace the positional wrapper, freeze it, keep the I/O names inside the archive."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import torch

from kiln.model.module import IO_FILE, TaskModule


def export_torchscript(module: TaskModule, example: tuple[torch.Tensor, ...], path: Path) -> list[Path]:
    with warnings.catch_warnings(), torch.inference_mode(False), torch.no_grad():
        warnings.simplefilter("ignore")  # tracer shape warnings; parity is checked right after export
        traced = torch.jit.trace(module, example, check_trace=False, strict=False)
        frozen = torch.jit.freeze(traced.eval())
    io_names = json.dumps({"inputs": list(module.input_names), "outputs": list(module.output_names)})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # TorchScript is deprecated upstream; still served
        torch.jit.save(frozen, str(path), _extra_files={IO_FILE: io_names})
    return [path]
