"""One served model, and a request's path through it: tokenize -> batcher (engine thread) -> finalize.

Batching decisions run on the event loop, and so does a small request's light finalisation
(``INLINE_FINALIZE_FEATURES``: cheaper than the hand-off to a thread); tokenization and other finalisation run on a
small worker pool, and the forward pass with pooling (``reduce``) on the engine session's own thread.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from kiln.artifact.directory import Artifact
from kiln.artifact.plan import ServingPlan
from kiln.choices import Scheduling, ShadowPolicy
from kiln.engines import EngineOptions
from kiln.errors import KilnError, UsageError
from kiln.log import get_logger
from kiln.records import to_jsonable
from kiln.records.artifact import Status
from kiln.runtime.predictor import Predictor
from kiln.serving.batcher import Batcher, BatchLimits, BatchStats, BatchTrace
from kiln.serving.coalesce import CoalescingPool
from kiln.serving.endpoints import HTTPError
from kiln.serving.generation import DecodeLoop
from kiln.serving.metrics import Metrics
from kiln.serving.shadow import BATCH, Shadow, ShadowConfig
from kiln.serving.supervision import LoopDied, OwnedLoop
from kiln.serving.tracing import NO_TRACE
from kiln.tasks import task_spec
from kiln.tasks.wire.http import RequestBody

log = get_logger("serve.inference")
# A task with a light finalize (TaskSpec.light_finalize: a few array operations per feature) finalizes a request of
# at most this many features on the event loop: a few microseconds of numpy per feature, against ~90 us of CPU for
# a round trip through the pool (an empty run_in_executor under uvloop: a concurrent Future and its Condition, the
# submit, the wake-up back).
INLINE_FINALIZE_FEATURES = 16
# A request of at most this many inputs is tokenized (and finalized, when not inline) in a shared pool turn
# (kiln.serving.coalesce); a larger one has the pool to itself, so that it does not hold up the small ones' turn.
SMALL_REQUEST = 16


@dataclass
class Served:
    name: str
    artifact: Artifact
    predictor: Predictor
    scheduler: Any  # the OwnedLoop that runs its requests (a Batcher, or a DecodeLoop for a decoder)
    variant: str
    task: str
    ready: bool = False
    info: dict[str, Any] = field(default_factory=dict)
    unready_reason: str = "the model is still loading"
    shadow: Shadow | None = None  # live agreement against the fp32 reference (--shadow-rate)
    fidelity_problem: str = ""  # set while the live agreement is below the gate under --shadow-policy unready

    def set_ready(self, ready: bool, metrics: Metrics, reason: str = "") -> None:
        self.ready = ready
        self.unready_reason = reason or self.unready_reason
        metrics.model_ready.labels(self.name).set(1 if ready else 0)

    def start(self, metrics: Metrics, *, restart: bool) -> None:
        """Start the model's loop under supervision: a death fails its queued requests (OwnedLoop), is logged and
        counted, and turns /ready off; with ``restart`` a fresh loop takes over and /ready turns back on."""

        def died(loop: OwnedLoop, error: BaseException) -> None:
            metrics.loop_deaths.labels(self.name, loop.kind).inc()
            log.error("model %s: the %s loop died (%s: %s); its queued requests got a 500%s", self.name, loop.kind,
                      type(error).__name__, error, "; restarting it" if restart else "; /ready is now 503",
                      exc_info=error if isinstance(error, Exception) else None)
            self.set_ready(False, metrics, f"the {loop.kind} loop of model {self.name!r} died "
                           f"({type(error).__name__}: {error}); restart the server")
            if restart and not loop._closing:
                loop.start()
                metrics.loop_restarts.labels(self.name, loop.kind).inc()
                self.set_ready(True, metrics)

        def shadow_died(loop: OwnedLoop, error: BaseException) -> None:  # serving goes on unmeasured
            metrics.loop_deaths.labels(self.name, loop.kind).inc()
            log.error("model %s: the shadow loop died (%s: %s); live agreement is no longer measured", self.name,
                      type(error).__name__, error)

        self.scheduler.start(died)
        if self.shadow is not None:
            self.shadow.start(shadow_died)

    async def close(self) -> None:
        """Finish every accepted request, then stop the shadow."""
        await self.scheduler.close()
        if self.shadow is not None:
            await self.shadow.close()

    def describe(self) -> dict[str, Any]:
        """/info's entry for this model."""
        return {**self.info, **({"shadow": self.shadow.summary()} if self.shadow else {})}


def served_variant(artifact: Artifact, *, deterministic: bool = False, variant: str | None = None) -> str:
    """The variant to serve: ``variant`` when named (an accepted one), else the artifact's best, or with
    ``deterministic`` the fastest accepted variant whose answers kiln optimize measured to be bit-identical whatever
    the batch (UsageError naming why there is none)."""
    if variant is not None:
        if deterministic:
            raise UsageError("variant cannot be combined with deterministic (each chooses the variant served)")
        record = artifact.variant(variant)  # a UsageError listing the artifact's variants
        if record.status is not Status.ACCEPTED:
            accepted = [n for n, r in artifact.manifest.variants.items() if r.status is Status.ACCEPTED]
            raise UsageError(f"variant {variant} of {artifact.path} was {record.status.value} by kiln optimize"
                             f"{': ' + record.reason if record.reason else ''}; the accepted ones: "
                             f"{', '.join(accepted) or '(none)'}")
        return variant
    best = artifact.variant_name()
    if not deterministic:
        return best
    variants = artifact.manifest.variants
    if variants[best].batch_invariant:
        return best
    invariant = [(r.timing.ms_per_sequence if r.timing else float("inf"), n) for n, r in variants.items()
                 if r.batch_invariant and r.status is Status.ACCEPTED]
    if invariant:
        chosen = min(invariant)[1]
        log.warning("--deterministic: serving %s instead of %s, whose answers move with the batch (%s)", chosen,
                    best, variants[best].batched.drift.describe() if variants[best].batched else "not measured")
        return chosen
    drifts = "; ".join(f"{n}: {r.batched.drift.describe() if r.batched else 'batch drift not measured'}"
                       for n, r in variants.items())
    raise UsageError(f"deterministic: no variant of {artifact.path} is batch-invariant ({drifts}); serve the whole "
                     "kiln optimize output (not only best/) so an invariant variant can be picked, or drop "
                     "--deterministic")


def load_served(name: str, path: Path, limits: BatchLimits, metrics: Metrics, *, threads: int | None,
                sessions: int | None, deterministic: bool = False, shadow: ShadowConfig | None = None,
                device: str = "cpu", variant: str | None = None) -> Served:
    """``variant``: the one to serve (None: the best for this CPU, see served_variant)."""
    artifact = Artifact.open(path)
    variant = served_variant(artifact, deterministic=deterministic, variant=variant)
    record = artifact.variant(variant)
    threads, sessions, solo, why = server_sessions(artifact, variant, threads=threads, sessions=sessions,
                                                   device=device, deterministic=deterministic)
    plan = replace(artifact.serving_plan(variant, threads=threads, sessions=sessions, device=device),
                   solo_threads=solo)
    log.info("model %s: %s on %s, %d session(s) x %s thread(s)%s (%s)", name, variant, device, plan.sessions,
             plan.options.intra_op_threads or "all", f", a request to an idle server on {solo}" if solo else "", why)
    predictor = artifact.predictor(variant, plan)
    if limits.max_batch_size is None:  # the sweep's batch size where kiln bench measured one
        default = artifact.serving_default(variant)
        limits = replace(limits, max_batch_size=default.batch_size if default else limits.batch_cap)

    def observe(stats: BatchStats) -> None:
        metrics.batch_size.observe(stats.size)
        metrics.batch_tokens.observe(stats.tokens)
        metrics.queue_seconds.observe(stats.queue_seconds)
        metrics.inference_seconds.observe(stats.inference_seconds)

    task = artifact.task_config.task
    validation = {"status": record.status, "agreement": record.agreement, "task_metric": record.task_metric,
                  "parity": record.parity, "batch_drift": record.batched.drift if record.batched else None,
                  "batch_invariant": record.batch_invariant}
    info = {"model": name, "task": task, "variant": variant, "engine": record.engine,
            "max_length": artifact.task_config.max_length, "source": to_jsonable(artifact.manifest.source),
            "validation": to_jsonable({k: v for k, v in validation.items() if v is not None}),
            "device": str(plan.options.device), "threads": plan.options.intra_op_threads,
            "sessions": len(predictor.sessions),
            "solo_threads": plan.solo_threads if predictor.solo is not None else None,
            "max_batch_size": limits.max_batch_size, "pad_multiple": predictor.pad_multiple,
            # which variant this CPU runs and why (kiln.artifact.cpu_pick); --deterministic may override it
            "cpu_pick": artifact.cpu_pick().to_dict()}
    scheduler = SCHEDULERS[predictor.handler.scheduling](predictor, limits, observe)
    info["max_batch_size"] = scheduler.batch_cap
    served = Served(name, artifact, predictor, scheduler, variant, task, info=info)
    if shadow is not None:
        served.shadow = _shadow(served, shadow, metrics)
    return served


def server_sessions(artifact: Artifact, variant: str, *, threads: int | None, sessions: int | None,
                    device: str = "cpu", deterministic: bool = False) -> tuple[int | None, int | None, int | None, str]:
    """Threads, sessions and solo threads a server runs ``variant`` with, and why: the caller's, else kiln bench's
    serving default, else, for a task served in batches, one single-thread session per usable core and a session of
    all of them for a request that finds the server idle (the batcher's solo; none under ``deterministic``, which
    promises an answer independent of what else runs: the solo computes on another number of threads than the
    sessions, which may change its last bits).

    A server's cores are shared with its event loop, its tokenization and (on a small box) its clients; one session
    of all threads then waits, at every op, for whichever of its threads was preempted, while single-thread sessions
    run on. On a 2-core AMX Xeon (openvino-bf16 MiniLM, 64 clients, benchmarks/serve_load.py) 2 x 1 served 227-240
    req/s at p99 452-495 ms against 142-180 req/s at p99 636-753 ms for 1 x 2. Its price is one request's latency
    when traffic is light (one request on one core: p50 16.5 ms against 7.1 ms at 1 client on the same machine),
    which the solo session pays back (one more session: for ONNX Runtime, one more copy of the weights).
    kiln bench's sweep times batches offline, so its choice, where there is one, stands. A decoder's loop runs on
    one session."""
    from kiln.system.cpu import cpu_info

    if threads is not None or sessions is not None:
        return threads, sessions, None, "--threads/--sessions"
    if device != "cpu":  # the GPU runs a batch's kernels; its host threads only launch them
        return threads, sessions, None, f"--device {device}: one session on the GPU"
    if artifact.serving_default(variant) is not None:
        return threads, sessions, None, "kiln bench's serving default"
    if task_spec(artifact.task_config.task).scheduling is not Scheduling.BATCH:
        return threads, sessions, None, "a decoder's loop runs on one session"
    cores = cpu_info().usable_cores
    if cores < 2:
        return threads, sessions, None, "one usable core"
    if deterministic:
        return 1, cores, None, ("one single-thread session per usable core (--deterministic: no session of all cores "
                                "for a request to an idle server); --sessions 1 for one session of all cores")
    return 1, cores, cores, ("one single-thread session per usable core under concurrent load, all cores for a "
                             "request to an idle server; --sessions 1 for one session of all cores")


def _shadow(served: Served, config: ShadowConfig, metrics: Metrics) -> Shadow:
    """The served model's shadow: its artifact's fp32 reference on one thread, batches of shadow.BATCH."""
    artifact, scheduler = served.artifact, served.scheduler
    reference = artifact.reference_variant()
    if not isinstance(scheduler, Batcher):
        raise UsageError(f"shadow_rate: model {served.name!r} decodes token by token; live agreement is measured "
                         "for one-pass tasks")
    if reference is None:
        raise UsageError(f"shadow_rate: {artifact.path} keeps no fp32 reference (re-run kiln optimize: it keeps "
                         "one beside the variants, best/ included)")
    predictor = artifact.predictor_of(reference, ServingPlan(EngineOptions(intra_op_threads=1), 1, BATCH))
    tolerance = artifact.manifest.build.tolerance
    judge = task_spec(served.task).validation
    floor = 1 - (tolerance if tolerance is not None else judge.default_tolerance)
    live_agreement = functools.partial(judge.live_agreement, served.predictor.handler)
    shadow = Shadow(served.name, predictor, live_agreement, config, metrics, floor, scheduler.idle,
                    lambda healthy, reason: _shadow_health(served, config, metrics, healthy, reason),
                    figure=judge.live_figure, judged=judge.live_judged)
    scheduler.shadow = shadow
    served.info["shadow_reference"] = reference.name
    return shadow


def _shadow_health(served: Served, config: ShadowConfig, metrics: Metrics, healthy: bool, reason: str) -> None:
    if config.policy is ShadowPolicy.UNREADY:
        served.fidelity_problem = "" if healthy else reason
        metrics.model_ready.labels(served.name).set(1 if healthy and served.ready else 0)


def _batcher(predictor: Predictor, limits: BatchLimits, observe: Callable[[BatchStats], None]) -> Batcher:
    return Batcher(predictor, limits, observe, predictor.sessions[1:])


def _decode_loop(predictor: Predictor, limits: BatchLimits, observe: Callable[[BatchStats], None]) -> DecodeLoop:
    return DecodeLoop(predictor, limits)


# How a task's requests are scheduled (TaskSpec.scheduling) -> the loop that owns its queue.
SCHEDULERS: dict[Scheduling, Callable[[Predictor, BatchLimits, Callable[[BatchStats], None]], OwnedLoop]] = {
    Scheduling.BATCH: _batcher, Scheduling.DECODE: _decode_loop}


async def infer(served: Served, body: RequestBody, pool: CoalescingPool, metrics: Metrics,
                max_inputs: int, trace: Any = NO_TRACE) -> tuple[Any, list[Any]]:
    """(prepared inputs, task results) for one request; errors are HTTPErrors with the right status. ``trace``
    (kiln.serving.tracing) receives a span per stage."""
    items, count = body.items(), body.input_count()
    if count > max_inputs:
        raise HTTPError(413, "too_many_inputs", f"{count} inputs in one request; the limit is {max_inputs} "
                        "(--max-inputs-per-request)")
    handler = served.predictor.handler
    try:
        options = handler.options(**body.options(), truncate=True)
        tokens = handler.token_outputs(options)
        if tokens:
            handler.check_token_engine(served.predictor.engine)
        start = time.perf_counter()
        # A small request's tokenization shares a pool turn with others' (kiln.serving.coalesce).
        prepared = await pool.run(count <= SMALL_REQUEST, served.predictor.prepare, items, options)
    except UsageError as err:
        raise HTTPError(422, "invalid_request", err.message) from err
    except Exception as err:  # the tokenizer or the task's pre-processing failed on this request's inputs
        log.error("pre-processing failed: %s: %s", type(err).__name__, err, exc_info=err)
        raise HTTPError(500, "preprocessing_failed", f"pre-processing failed: {type(err).__name__}: {err}") from err
    tokenized = time.perf_counter()
    metrics.tokenize_seconds.observe(tokenized - start)
    trace.child("tokenize", start, tokenized, inputs=count, features=len(prepared.encodings))
    if not body.truncate and any(prepared.truncated):
        index = prepared.truncated.index(True)
        raise HTTPError(413, "input_too_long", f"input {index} is longer than the model's "
                        f"{served.artifact.task_config.max_length} tokens and truncate is false")
    batches: list[BatchTrace] = []
    try:
        reduced = await served.scheduler.submit(prepared.encodings, batches, tokens=tokens)
    except LoopDied as err:
        raise HTTPError(500, "inference_failed", str(err)) from err
    except Exception as err:  # the batch this request was in failed (logged there); every request in it gets this
        raise HTTPError(500, "inference_failed", f"inference failed: {type(err).__name__}: {err}") from err
    for batch in batches:
        trace.child("queue", batch.arrived, batch.formed)
        trace.child("batch", batch.formed, batch.started, batch_size=batch.size)
        trace.child("engine", batch.started, batch.finished, batch_size=batch.size)
    start = time.perf_counter()
    try:
        args = (prepared, reduced, options, served.predictor.encoder)
        if handler.light_finalize and len(reduced) <= INLINE_FINALIZE_FEATURES:
            results = handler.finalize(*args)
        else:
            results = await pool.run(len(reduced) <= SMALL_REQUEST, handler.finalize, *args)
        trace.child("postprocess", start, time.perf_counter())
    except KilnError as err:
        raise HTTPError(422, "invalid_request", err.message) from err
    except Exception as err:
        log.error("post-processing failed: %s: %s", type(err).__name__, err, exc_info=err)
        raise HTTPError(500, "postprocessing_failed", f"post-processing failed: {type(err).__name__}: {err}") \
            from err
    return prepared, results
