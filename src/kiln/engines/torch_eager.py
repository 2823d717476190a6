"""PyTorch eager engine: the fp32 reference, and bf16/fp16 autocast."""

from __future__ import annotations

from contextlib import nullcontext
from pathlib import Path
from typing import Any

import numpy as np

from kiln.choices import Precision
from kiln.engines.base import EngineOptions, warmup_inputs
from kiln.errors import UsageError

_AUTOCAST = {Precision.BF16: "bfloat16", Precision.FP16: "float16"}


def require_torch_device(device: str, runtime: str = "torch") -> None:
    """A UsageError where libtorch cannot run on ``device`` (before a module moves there and fails mid-load)."""
    import torch

    if device == "tensorrt":
        raise UsageError(f"device tensorrt is an ONNX Runtime provider; {runtime} runs on cpu or cuda")
    if device == "cuda" and not torch.cuda.is_available():
        raise UsageError(f"device cuda: this torch {torch.__version__} sees no CUDA GPU; {runtime} variants run on "
                         "cpu here, or install a CUDA build of torch on a GPU machine")


def configure_torch_threads(options: EngineOptions) -> None:
    apply_threads(options.intra_op_threads)


def apply_threads(threads: int | None) -> None:
    """Set torch's thread count before a run: it is process-global, so another torch engine may have changed it."""
    import torch

    if threads and torch.get_num_threads() != threads:
        torch.set_num_threads(threads)


class TorchEngine:
    """Runs a positional-input task module (see :mod:`kiln.model.module`) under inference mode."""

    name = "torch"
    is_padded = True
    pad_multiple = 1

    def __init__(self, module: Any, options: EngineOptions = EngineOptions()) -> None:
        import torch

        require_torch_device(options.device)
        configure_torch_threads(options)
        self._torch = torch
        from kiln.model.module import placed_on

        self._device = torch.device(options.device)
        self._module = placed_on(module, options.device).eval()
        self._precision = options.precision
        self._threads = options.intra_op_threads
        self.input_names = tuple(module.input_names)
        self.output_names = tuple(module.output_names)
        self.providers = (f"torch-{options.device}-{options.precision.value}",)

    @classmethod
    def from_path(cls, path: Path, options: EngineOptions = EngineOptions()) -> TorchEngine:
        from kiln.model.module import load_task_module

        return cls(load_task_module(path), options)

    def _autocast(self):
        if self._precision is Precision.FP32:
            return nullcontext()
        return self._torch.autocast(self._device.type, dtype=getattr(self._torch, _AUTOCAST[self._precision]))

    def run(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        torch = self._torch
        apply_threads(self._threads)
        tensors = [torch.from_numpy(np.ascontiguousarray(inputs[n])).to(self._device) for n in self.input_names]
        with torch.inference_mode(), self._autocast():
            outputs = self._module(*tensors)
        return {n: o.float().cpu().numpy() for n, o in zip(self.output_names, outputs)}

    def warmup(self) -> None:
        self.run(warmup_inputs(self.input_names))
