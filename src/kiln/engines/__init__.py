"""The engine registry: engine name -> factory taking a model file and options."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from kiln.engines.base import Engine, EngineOptions
from kiln.errors import UsageError


def _onnxruntime(path: Path, options: EngineOptions) -> Engine:
    from kiln.engines.onnxruntime import OnnxRuntimeEngine

    return OnnxRuntimeEngine(path, options)


def _torchscript(path: Path, options: EngineOptions) -> Engine:
    from kiln.engines.torchscript import TorchScriptEngine

    return TorchScriptEngine(path, options)


def _torch(path: Path, options: EngineOptions) -> Engine:
    from kiln.engines.torch_eager import TorchEngine

    return TorchEngine.from_path(path, options)


def _openvino(path: Path, options: EngineOptions) -> Engine:
    from kiln.engines.openvino import OpenVinoEngine

    return OpenVinoEngine(path, options)


# Factories import their runtime lazily so that serving an ONNX artifact never imports torch.
ENGINES: dict[str, Callable[[Path, EngineOptions], Engine]] = {
    "onnxruntime": _onnxruntime,
    "torchscript": _torchscript,
    "torch": _torch,
    "openvino": _openvino,
}


def create_engine(name: str, path: Path, options: EngineOptions = EngineOptions()) -> Engine:
    if name not in ENGINES:
        raise UsageError(f"engine must be one of: {', '.join(ENGINES)} (got {name!r})")
    return ENGINES[name](path, options)


__all__ = ["ENGINES", "Engine", "EngineOptions", "create_engine"]
