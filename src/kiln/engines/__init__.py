"""The engine registry: engine name -> factory taking a model file and options."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from kiln.engines.base import THROUGHPUT_STREAMS, Engine, EngineOptions, require_cpu
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


def _static(path: Path, options: EngineOptions) -> Engine:
    from kiln.engines.static import StaticEngine

    check_device("static", options.device)
    return StaticEngine(path)


# Factories import their runtime lazily so that serving an ONNX artifact never imports torch.
ENGINES: dict[str, Callable[[Path, EngineOptions], Engine]] = {
    "onnxruntime": _onnxruntime,
    "torchscript": _torchscript,
    "torch": _torch,
    "openvino": _openvino,
    "static": _static,  # a static-embedding table (kiln distill --static)
}


# Engines whose loading kiln optimize tries in a child process first (kiln.engines.probe): OpenVINO's CPU plugin
# died of SIGFPE compiling rotary encoders for bf16 on one thread (2026.4.1). ONNX Runtime sessions load in-process.
PROBED_ENGINES = frozenset({"openvino"})


def create_engine(name: str, path: Path, options: EngineOptions = EngineOptions()) -> Engine:
    if name not in ENGINES:
        raise UsageError(f"engine must be one of: {', '.join(ENGINES)} (got {name!r})")
    engine = ENGINES[name](path, options)
    return _rows_alone(engine) if options.rows_alone else engine


def _rows_alone(engine: Engine) -> Engine:
    """``engine`` batch-invariant: each row of a batch run on its own (kiln.engines.rows)."""
    from kiln.engines.rows import RowByRow

    return RowByRow(engine)


def _onnxruntime_device(device: str) -> None:
    from kiln.engines.onnxruntime import require_provider

    require_provider(device)


def _torch_device(runtime: str) -> Callable[[str], None]:
    def check(device: str) -> None:
        from kiln.engines.torch_eager import require_torch_device

        require_torch_device(device, runtime)

    return check


# Whether an engine can run on a device, asked before anything loads: the error each engine would raise at load,
# given up front (kiln serve --device checks every served model before the server starts).
DEVICE_CHECKS: dict[str, Callable[[str], None]] = {
    "onnxruntime": _onnxruntime_device,
    "torchscript": _torch_device("TorchScript"),
    "torch": _torch_device("torch"),
    "openvino": lambda device: require_cpu(device, "OpenVINO"),
    "static": lambda device: require_cpu(device, "static embeddings (a table lookup)"),
}


def check_device(engine: str, device: str) -> None:
    """A UsageError where ``engine`` cannot run on ``device`` here."""
    DEVICE_CHECKS[engine](device)


# Engines that run parallel requests on one compiled model (OpenVINO CPU streams): their sessions are infer
# requests of one model compiled with a stream per session, so the weights are in memory once.
STREAMING_ENGINES = ("openvino",)
# Engines whose one loaded model takes calls from several threads at once, each computed on its caller's thread
# when a session has one thread: single-thread sessions are views of one loaded model (weights and arena once).
SHARED_SESSION_ENGINES = ("onnxruntime",)


def open_sessions(name: str, path: Path, options: EngineOptions, count: int | None) -> list[Engine]:
    """``count`` engine sessions that run batches side by side, each with ``options.intra_op_threads``; None (a
    streaming engine): as many as the runtime's throughput hint picks, sharing ``options.intra_op_threads`` (None:
    all cores).

    Each session is driven from its own thread (the predictor's pool, the server's batcher); the runtimes release
    the GIL while they compute, so a synchronous call per session thread overlaps like an asynchronous queue.
    """
    if count is None:
        if name not in STREAMING_ENGINES:
            raise UsageError(f"the runtime picks the sessions of {', '.join(STREAMING_ENGINES)} only (got {name})")
        engine = create_engine(name, path, replace(options, streams=THROUGHPUT_STREAMS))
        return engine.requests(engine.streams)  # type: ignore[attr-defined]
    if count < 1:
        raise UsageError(f"sessions must be at least 1 (got {count})")
    if name in STREAMING_ENGINES:
        threads = options.intra_op_threads * count if options.intra_op_threads else None
        engine = create_engine(name, path, replace(options, streams=count, intra_op_threads=threads))
        return engine.requests(count)  # type: ignore[attr-defined]
    if name in SHARED_SESSION_ENGINES and count > 1 and options.intra_op_threads == 1 and options.device == "cpu":
        # One session per core was one loaded model per core: MiniLM fp32, 16 single-thread sessions each running 4
        # batches of 32 texts of up to 208 tokens, 6,261 MiB resident as 16 sessions (1,532 to load), 3,516 as views
        # of one (125 to load), the same speed within noise (2-core EPYC, AVX2; `python benchmarks/serving_memory.py
        # sessions OUT/best --sessions 16 --batches 4 --rounds 1`; 2 sessions, 32 batches: 915-929 MiB against 716-721).
        views = ENGINES[name](path, replace(options, rows_alone=False)).views(count)  # type: ignore[attr-defined]
        return [_rows_alone(view) if options.rows_alone else view for view in views]
    return [create_engine(name, path, options) for _ in range(count)]


__all__ = ["ENGINES", "Engine", "EngineOptions", "create_engine", "open_sessions"]
