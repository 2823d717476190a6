"""TorchScript engine: a traced, frozen module loaded without transformers."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import numpy as np

from kiln.engines.base import EngineOptions, warmup_inputs
from kiln.engines.torch_eager import apply_threads, configure_torch_threads, require_torch_device
from kiln.errors import ArtifactError, UsageError, missing_dependency
from kiln.model.module import IO_FILE  # stored inside the .pt archive as an extra file


class TorchScriptEngine:
    name = "torchscript"
    is_padded = True
    pad_multiple = 1

    def __init__(self, path: Path, options: EngineOptions = EngineOptions()) -> None:
        try:
            import torch
        except ImportError as err:  # a serving install without libtorch
            raise missing_dependency("torch", "torch", err) from err

        require_torch_device(options.device, "TorchScript")
        configure_torch_threads(options)
        # The profiling executor may re-specialise the graph for new input shapes; the simple executor runs
        # the frozen graph as is. On torch 2.13 CPU both held a steady per-token time over 60 random lengths
        # (MiniLM, batch 8: ~206 us/token after the first calls), so this costs nothing and rules out
        # shape-triggered re-optimisation on builds where it does happen.
        torch._C._jit_set_profiling_executor(False)
        extra = {IO_FILE: ""}
        try:
            with warnings.catch_warnings():
                # torch 2.9+ deprecates TorchScript in favour of torch.export; kiln offers it for libtorch users.
                warnings.simplefilter("ignore", DeprecationWarning)
                self._module = torch.jit.load(str(path), map_location=options.device, _extra_files=extra)
        except (RuntimeError, ValueError) as err:
            raise ArtifactError(f"cannot load TorchScript model {path}: {err}") from err
        io = json.loads(extra[IO_FILE] or "{}")
        if not io:
            raise ArtifactError(f"{path} was not written by kiln (no {IO_FILE} inside)")
        traced_on = io.get("device", "cpu")  # archives from before kiln recorded it were traced on the CPU
        if traced_on != torch.device(options.device).type:
            raise UsageError(f"device {options.device}: this TorchScript was traced on {traced_on}, and a trace "
                             f"keeps some constants on its device; run it on {traced_on}, or re-run kiln optimize "
                             f"--target {options.device} for a {options.device} one")
        self._torch = torch
        self._threads = options.intra_op_threads
        self._device = torch.device(options.device)
        self.input_names = tuple(io["inputs"])
        self.output_names = tuple(io["outputs"])
        self.providers = (f"torchscript-{options.device}",)

    def run(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        torch = self._torch
        apply_threads(self._threads)
        tensors = [torch.from_numpy(np.ascontiguousarray(inputs[n])).to(self._device) for n in self.input_names]
        with torch.inference_mode():
            outputs = self._module(*tensors)
        return {n: o.float().cpu().numpy() for n, o in zip(self.output_names, outputs)}

    def warmup(self) -> None:
        for length in (8, 16):  # two shapes: the first call of a shape pays for optimisation
            self.run(warmup_inputs(self.input_names, length))
