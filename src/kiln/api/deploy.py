"""Running artifacts where users are, from Python: ``kiln.serve`` (HTTP and gRPC with dynamic batching),
``kiln.embed`` (a corpus into Parquet parts, on Ray too) and ``kiln.triton`` (a Triton model repository). The CLI's
commands of the same names are made of these functions, with the same parameters as their options.

Each function imports its job when called, so that `import kiln` stays free of torch, transformers and the server's
packages (a serving install has no torch).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from kiln.choices import Device, LogFormatName, ShadowPolicy

if TYPE_CHECKING:
    from kiln.bulk.job import EmbedSummary


def _models(artifact: str | Path | None, model: Sequence[str] | Mapping[str, str | Path]) -> dict[str, Path]:
    """Served name -> artifact directory, from ``model`` (NAME=ARTIFACT strings, or a mapping) and ``artifact``."""
    from kiln.errors import UsageError

    if isinstance(model, Mapping):
        models = {str(name): Path(path) for name, path in model.items()}
    else:
        models = {name: Path(path) for name, path in _pairs(model, "model must be NAME=ARTIFACT").items()}
    if artifact is not None:
        artifact = Path(artifact)
        models.setdefault(artifact.name if artifact.name != "best" else artifact.resolve().parent.name, artifact)
    if not models:
        raise UsageError("name an artifact to serve: kiln serve kiln-out/best (or --model NAME=ARTIFACT)")
    return models


def _variants(variant: str | Sequence[str] | Mapping[str, str] | None, models: Mapping[str, Path]) -> dict[str, str]:
    """Served name -> the variant to serve, from ``variant``: one name (every model's), MODEL=VARIANT strings, or a
    mapping."""
    if variant is None:
        return {}
    if isinstance(variant, Mapping):
        return {str(name): str(v) for name, v in variant.items()}
    items = [variant] if isinstance(variant, str) else list(variant)
    if len(items) == 1 and "=" not in items[0]:
        return dict.fromkeys(models, items[0])
    return _pairs(items, "variant must be VARIANT, or MODEL=VARIANT for each of several models")


def _pairs(items: Sequence[str], refusal: str) -> dict[str, str]:
    """NAME=VALUE strings as {name: value}; one malformed is a UsageError: ``refusal`` (got the item)."""
    from kiln.errors import UsageError

    pairs: dict[str, str] = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep or not name or not value:
            raise UsageError(f"{refusal} (got {item!r})")
        pairs[name] = value
    return pairs


def serve(artifact: str | Path | None = None, *, host: str = "127.0.0.1", port: int = 8000,
          model: Sequence[str] | Mapping[str, str | Path] = (), max_batch_tokens: int = 16384,
          max_batch_size: int | None = None, max_delay_ms: float = 5.0, batch_window: int | None = None,
          max_concurrent: int = 512, max_memory: str | int | None = "auto", api_key: str | None = None,
          threads: int | None = None,
          device: Device | str = Device.CPU, sessions: int | None = None, max_inputs_per_request: int = 64,
          access_log: bool = False, log_format: LogFormatName | str = LogFormatName.TEXT, restart_loops: bool = False,
          deterministic: bool = False, shadow_rate: float | None = None, shadow_max_share: float = 0.10,
          shadow_min_share: float = 0.02, shadow_policy: ShadowPolicy | str = ShadowPolicy.LOG,
          otlp_endpoint: str | None = None, protocols: str | Sequence[str] = "kiln,openai,v2,tei,cohere",
          grpc_port: int | None = None, variant: str | Sequence[str] | Mapping[str, str] | None = None) -> bool:
    """``kiln serve``: serve ``artifact`` (or several: ``model={"name": path}`` or ``["name=path"]``) over HTTP with
    dynamic batching, Prometheus metrics and backpressure until SIGTERM or SIGINT, then drain. ``variant`` serves a
    named accepted variant instead of the best (one name for every model, or ``["model=variant"]`` / a mapping).
    Every served model's engine is checked on ``device`` before the server starts (a UsageError names why not).
    Returns whether the server started (False: uvicorn has logged why, e.g. the port is in use)."""
    from kiln.artifact.directory import Artifact
    from kiln.choices import WireProtocol, parse_choice
    from kiln.engines import check_device
    from kiln.serving.app import ServeConfig, create_app
    from kiln.serving.batcher import BatchLimits
    from kiln.serving.inference import served_variant
    from kiln.serving.server import run_server
    from kiln.serving.shadow import ShadowConfig

    models = _models(artifact, model)
    variants = _variants(variant, models)
    device = parse_choice(Device, device, "device")
    limits = BatchLimits(max_batch_tokens, max_batch_size, max_delay_ms / 1000,
                         **({"window_requests": batch_window} if batch_window is not None else {}))
    listed = protocols if isinstance(protocols, str) else ",".join(protocols)
    from kiln.serving.admission import memory_budget

    config = ServeConfig(models=models, limits=limits, max_concurrent=max_concurrent,
                         max_memory=memory_budget(max_memory), api_key=api_key,
                         threads=threads, sessions=sessions, max_inputs_per_request=max_inputs_per_request,
                         restart_loops=restart_loops, otlp_endpoint=otlp_endpoint, deterministic=deterministic,
                         shadow=ShadowConfig(shadow_rate, shadow_max_share, parse_choice(ShadowPolicy, shadow_policy,
                                                                                         "shadow_policy"),
                                             min_share=shadow_min_share)
                         if shadow_rate is not None else None,
                         protocols=WireProtocol.parse_list(listed, "protocols"), grpc_port=grpc_port, device=device,
                         variants=variants)
    for name, path in models.items():  # a clear error before the server starts
        opened = Artifact.open(path)
        served = served_variant(opened, deterministic=deterministic, variant=variants.get(name))
        check_device(opened.variant(served).engine, device)
    return run_server(create_app(config), host, port, access_log=access_log,
                      log_format=parse_choice(LogFormatName, log_format, "log_format").value)


def embed(artifact: str | Path, input: str | Path, *, output: str | Path, text_field: str = "text",
          id_field: str | None = None, resume: bool = False, rows_per_part: int = 10_000, window: int = 1024,
          variant: str | None = None, threads: int | None = None, ray: str | None = None, actors: int | None = None,
          precision: str = "float32", overwrite: bool = False,
          progress: Callable[[int, int], None] = lambda done, total: None) -> EmbedSummary:
    """``kiln embed``: embed every text of ``input`` (.jsonl, .csv or .parquet) with ``artifact`` into ordered
    Parquet parts in ``output`` (columns id and vector); ``resume`` finishes a killed run, ``ray`` ("local", "auto"
    or an address) spreads the windows over a Ray cluster. ``progress(done, total)`` after each window."""
    from kiln.bulk.job import EmbedConfig, run_embed

    config = EmbedConfig(artifact=Path(artifact), input=Path(input), output=Path(output), text_field=text_field,
                         id_field=id_field, rows_per_part=rows_per_part, window=window, resume=resume,
                         overwrite=overwrite, variant=variant, threads=threads, ray=ray, actors=actors,
                         precision=precision)
    return run_embed(config, progress)


def triton(artifact: str | Path, *, output: str | Path = "kiln-triton", device: Device | str = Device.CPU,
           python_model: bool = False, buckets: Sequence[int] | None = None, max_batch_size: int = 32,
           max_queue_delay_us: int = 2000, instances: int | None = None, overwrite: bool = False) -> Path:
    """``kiln triton``: write a Triton model repository for ``artifact`` (an ensemble: tokenizer -> model ->
    post-processing, dynamic batching over length ``buckets``), check that every config parses with Triton's own
    protobuf schema and that the ensemble is wired, and return the repository's path."""
    from kiln.integrations.triton.repository import TritonConfig, write_repository

    return write_repository(TritonConfig(
        artifact=Path(artifact), output=Path(output), device=device, python_model=python_model,
        buckets=tuple(buckets) if buckets else None, max_batch_size=max_batch_size,
        max_queue_delay_us=max_queue_delay_us, instances=instances, overwrite=overwrite))
