"""TorchScript export: trace the positional wrapper, freeze it, keep the I/O names inside the archive."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import torch

from kiln.model.module import IO_FILE, TaskModule, placed_on


def export_torchscript(module: TaskModule, example: tuple[torch.Tensor, ...], path: Path,
                       device: str = "cpu") -> list[Path]:
    """Trace and freeze ``module`` on ``device``. The trace keeps tensors the model makes on the fly (transformers'
    attention-mask fill value) as constants on that device, and map_location does not move them: on an H100 a
    CPU trace loaded on cuda failed with "Expected all tensors to be on the same device". So a TorchScript runs on
    the device it was traced on, which the archive records."""
    module = placed_on(module, device)
    example = tuple(t.to(device) for t in example)
    with warnings.catch_warnings(), torch.inference_mode(False), torch.no_grad():
        warnings.simplefilter("ignore")  # tracer shape warnings; parity is checked right after export
        traced = torch.jit.trace(module, example, check_trace=False, strict=False)
        frozen = torch.jit.freeze(traced.eval())
    io_names = json.dumps({"inputs": list(module.input_names), "outputs": list(module.output_names),
                           "device": torch.device(device).type})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # TorchScript is deprecated upstream; still served
        torch.jit.save(frozen, str(path), _extra_files={IO_FILE: io_names})
    return [path]
