"""ONNX Runtime engine: CPU with configurable threads; CUDA and TensorRT with IOBinding."""

from __future__ import annotations

import copy
from pathlib import Path

import numpy as np

from kiln.engines.base import EngineOptions, warmup_inputs
from kiln.errors import ArtifactError, UsageError

PROVIDERS: dict[str, tuple[str, ...]] = {
    "cpu": ("CPUExecutionProvider",),
    "cuda": ("CUDAExecutionProvider", "CPUExecutionProvider"),
    "tensorrt": ("TensorrtExecutionProvider", "CUDAExecutionProvider", "CPUExecutionProvider"),
}
# ONNX Runtime's CUDA provider runs fp32 MatMuls as TF32 on Ampere and later unless told not to (use_tf32=1 by
# default): on an H200 a 256x256 MatMul came out at 2.9e-4 relative error against 1.5e-7 with use_tf32=0, and a tiny
# BERT's hidden states moved by up to 2.9e-3 from the CPU's. An fp32 variant is what the others are judged against,
# and kiln builds fp16 for speed on GPUs, so fp32 stays fp32.
PROVIDER_OPTIONS: dict[str, dict[str, str]] = {"CUDAExecutionProvider": {"use_tf32": "0"}}

# Why a listed GPU provider may still fail to start: onnxruntime-gpu lists its providers whether or not the
# libraries they load are installed.
_FALLBACK_HINTS = {
    "TensorrtExecutionProvider": " (its provider loads TensorRT's libnvinfer, which onnxruntime-gpu does not ship: "
                                 "install TensorRT, or use --device cuda)",
    "CUDAExecutionProvider": " (its provider loads CUDA's and cuDNN's libraries: check they match this "
                             "onnxruntime-gpu build)",
}
_NUMPY_TYPES = {"tensor(int64)": np.int64, "tensor(int32)": np.int32, "tensor(float)": np.float32}


def session_options(options: EngineOptions):
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads = options.intra_op_threads or 0
    so.inter_op_num_threads = options.inter_op_threads or 0
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    so.enable_cpu_mem_arena = options.memory_arena
    if not options.spin_wait:
        so.add_session_config_entry("session.intra_op.allow_spinning", "0")
    return so


def require_provider(device: str) -> tuple[str, ...]:
    """The providers ``device`` asks for, or a UsageError when this onnxruntime build lacks its first."""
    import onnxruntime as ort

    wanted = PROVIDERS[device]
    available = ort.get_available_providers()
    if wanted[0] not in available:
        raise UsageError(
            f"device {device} needs {wanted[0]}, which this onnxruntime build lacks "
            f"(available: {', '.join(available)}); install onnxruntime-gpu on a CUDA machine"
        )
    return wanted


class OnnxRuntimeEngine:
    name = "onnxruntime"
    is_padded = True
    pad_multiple = 1

    def __init__(self, path: Path, options: EngineOptions = EngineOptions()) -> None:
        self.holds_memory = options.memory_arena  # False: validation; calls hand their memory back
        import onnxruntime as ort

        wanted = require_provider(options.device)
        try:
            self.session = ort.InferenceSession(str(path), session_options(options),
                                                providers=[(p, PROVIDER_OPTIONS.get(p, {})) for p in wanted])
        except Exception as err:  # onnxruntime raises its own exception types for bad or truncated files
            raise ArtifactError(f"ONNX Runtime cannot load {path}: {err}") from err
        self.providers = tuple(self.session.get_providers())
        if self.providers[0] != wanted[0]:  # ORT falls back to CPU silently when a GPU provider fails
            raise UsageError(f"ONNX Runtime fell back from {wanted[0]} to {self.providers[0]} for {path}"
                             f"{_FALLBACK_HINTS.get(wanted[0], '')}")
        self._input_types = {i.name: _NUMPY_TYPES.get(i.type, np.int64) for i in self.session.get_inputs()}
        self.input_names = tuple(self._input_types)
        self.output_names = tuple(o.name for o in self.session.get_outputs())
        # Outputs with a token axis (kiln's export names dynamic axis 1 "sequence"): what RowByRow pads back.
        self.sequence_outputs = frozenset(o.name for o in self.session.get_outputs()
                                          if len(o.shape) > 1 and o.shape[1] == "sequence")
        self._on_gpu = options.device != "cpu"

    def _feed(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        return {n: np.ascontiguousarray(inputs[n], dtype=t) for n, t in self._input_types.items()}

    def run(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        feed = self._feed(inputs)
        if self._on_gpu:
            return self._run_bound(feed)
        outputs = self.session.run(list(self.output_names), feed)
        return {n: np.asarray(o, dtype=np.float32) for n, o in zip(self.output_names, outputs)}

    def _run_bound(self, feed: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """IOBinding: inputs copied to the GPU once, outputs allocated there, one copy back at the end."""
        import onnxruntime as ort

        binding = self.session.io_binding()
        for name, array in feed.items():
            binding.bind_ortvalue_input(name, ort.OrtValue.ortvalue_from_numpy(array, "cuda", 0))
        for name in self.output_names:
            binding.bind_output(name, "cuda", 0)
        self.session.run_with_iobinding(binding)
        outputs = binding.copy_outputs_to_cpu()
        return {n: np.asarray(o, dtype=np.float32) for n, o in zip(self.output_names, outputs)}

    def views(self, count: int) -> list[OnnxRuntimeEngine]:
        """``count`` sessions on this one InferenceSession, each to be called from its own thread.

        ONNX Runtime runs calls to one session from several threads at once; with one intra-op thread each call
        computes on its caller's thread, so single-thread sessions lose nothing by sharing one, and the weights
        and the CPU arena are held once instead of once per session (see open_sessions for the figures)."""
        return [self, *(copy.copy(self) for _ in range(count - 1))]

    def warmup(self) -> None:
        self.run(warmup_inputs(self.input_names, float_shapes={
            i.name: i.shape for i in self.session.get_inputs() if i.type == "tensor(float)"}))
