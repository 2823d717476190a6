"""One served model, and a request's path through it: tokenize (pool) -> batcher (engine thread) -> finalize (pool).

Only batching decisions run on the event loop; tokenization and finalisation run on a small worker pool and
the forward pass with pooling (``reduce``) on the engine session's own thread.
"""

from __future__ import annotations

import asyncio
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from kiln.artifact.directory import Artifact
from kiln.errors import KilnError, UsageError
from kiln.runtime.predictor import Predictor
from kiln.serve.batcher import Batcher, BatchLimits, BatchStats
from kiln.serve.metrics import Metrics
from kiln.tasks.http import RequestBody


class HTTPError(Exception):
    """An answer other than 200, with the error type and message the JSON body carries."""

    def __init__(self, status: int, kind: str, message: str, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status, self.kind, self.message, self.headers = status, kind, message, headers or {}


@dataclass
class Served:
    name: str
    artifact: Artifact
    predictor: Predictor
    batcher: Batcher
    variant: str
    task: str
    ready: bool = False
    info: dict[str, Any] = field(default_factory=dict)


def load_served(name: str, path: Path, limits: BatchLimits, metrics: Metrics, *, threads: int | None,
                sessions: int | None) -> Served:
    artifact = Artifact.open(path)
    variant = artifact.variant_name()
    record = artifact.variant(variant)
    plan = artifact.serving_plan(variant, threads=threads, sessions=sessions)
    predictor = artifact.predictor(variant, plan)
    if limits.max_batch_size is None:  # the sweep's batch size where kiln bench measured one
        limits = replace(limits, max_batch_size=artifact.serving_default(variant).get("batch_size",
                                                                                    limits.batch_cap))

    def observe(stats: BatchStats) -> None:
        metrics.batch_size.observe(stats.size)
        metrics.batch_tokens.observe(stats.tokens)
        metrics.queue_seconds.observe(stats.queue_seconds)
        metrics.inference_seconds.observe(stats.inference_seconds)

    task = artifact.task_config.task
    info = {"model": name, "task": task, "variant": variant, "engine": record["engine"],
            "max_length": artifact.task_config.max_length, "source": artifact.manifest.source,
            "validation": {k: record.get(k) for k in ("status", "agreement", "task_metric", "parity") if k in record},
            "threads": plan.options.intra_op_threads, "sessions": len(predictor.sessions),
            "max_batch_size": limits.max_batch_size, "pad_multiple": predictor.pad_multiple}
    if predictor.handler.generates:  # a decoder: continuous batching per decoding step instead of the batcher
        from kiln.serve.generation import DecodeLoop

        loop = DecodeLoop(predictor, limits)
        info["max_batch_size"] = loop.slots
        return Served(name, artifact, predictor, loop, variant, task, info=info)  # type: ignore[arg-type]
    return Served(name, artifact, predictor, Batcher(predictor, limits, observe, predictor.sessions[1:]), variant,
                  task, info=info)


async def infer(served: Served, body: RequestBody, pool: ThreadPoolExecutor, metrics: Metrics,
                max_inputs: int) -> tuple[Any, list[Any]]:
    """(prepared inputs, task results) for one request; errors are HTTPErrors with the right status."""
    items, count = body.items(), body.input_count()
    if count > max_inputs:
        raise HTTPError(413, "too_many_inputs", f"{count} inputs in one request; the limit is {max_inputs} "
                        "(--max-inputs-per-request)")
    handler = served.predictor.handler
    loop = asyncio.get_running_loop()
    try:
        options = handler.options(**body.options(), truncate=True)
        start = time.perf_counter()
        prepared = await loop.run_in_executor(pool, served.predictor.prepare, items, options)
    except UsageError as err:
        raise HTTPError(422, "invalid_request", err.message) from err
    metrics.tokenize_seconds.observe(time.perf_counter() - start)
    if not body.truncate and any(prepared.truncated):
        index = prepared.truncated.index(True)
        raise HTTPError(413, "input_too_long", f"input {index} is longer than the model's "
                        f"{served.artifact.task_config.max_length} tokens and truncate is false")
    try:
        reduced = await served.batcher.submit(prepared.encodings)
    except Exception as err:  # the batch this request was in failed; every request in it gets this answer
        raise HTTPError(500, "inference_failed", f"inference failed: {type(err).__name__}: {err}") from err
    try:
        results = await loop.run_in_executor(pool, handler.finalize, prepared, reduced, options,
                                             served.predictor.encoder)
    except KilnError as err:
        raise HTTPError(422, "invalid_request", err.message) from err
    return prepared, results
