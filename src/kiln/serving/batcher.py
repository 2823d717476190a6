"""The dynamic batcher: one asyncio task owns the queue and turns single requests into packed batches.

Which features go together: the look-ahead window (the features of the oldest ``window_requests`` requests, at
most ``window`` of them) is sorted by length and cut into contiguous groups that minimise the total cost, sum over
groups of (``call_overhead_tokens`` + widest x count, widths padded to the engine's multiple as collation pads),
within ``max_batch_size`` and ``max_batch_tokens`` (padded cost) per group. On a CPU the per-token cost barely falls
past batch ~8, so one 64-wide batch of mixed lengths (half of it padding) is slower than several batches of similar
lengths; the cost model makes that cut. The group holding the feature whose answer is due first runs next: the
oldest, a wide feature counted older by the time its batch will take (its width x the served batches' mean size x
their seconds per padded token), because a long text's batch runs longer and must start sooner to finish as soon.
A feature is overtaken only by those that arrived less than that time after it, so nothing starves.

When a batch closes: at once when a session is idle (waiting cannot help a lone request; one whose requests all found
the server idle runs on the predictor's solo session of all cores where it has one); while every session runs,
the next one is formed and collated (prefetched) when it is full by size or tokens, or when its oldest feature
has waited ``max_delay``. Features of requests whose client went away are dropped before they cost compute; if
a batch fails, every request in it gets the error, and if the loop itself dies every queued request does
(``OwnedLoop``). Each session (engine instance, ``--sessions``) runs its batches on its own thread and takes the
next formed batch there (kiln.serving.sessions); sorting the window, the partition search and collation run on one
more thread (the "former"), so the event loop only moves requests in and answers out: ~1 ms of partition per
256-input window would otherwise delay every other request.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import partial
from typing import Any

from tokenizers import Encoding

from kiln.engines.base import Engine, warm_every_length
from kiln.log import get_logger, request_id
from kiln.runtime.batch_plan import RUN_TOKENS, least_cost_groups
from kiln.runtime.predictor import Predictor
from kiln.runtime.tokenization import padded_width
from kiln.serving.sessions import Job, Sessions
from kiln.serving.supervision import OwnedLoop

DEFAULT_MAX_BATCH = 64
log = get_logger("serve.batcher")


@dataclass(frozen=True)
class BatchLimits:
    max_batch_tokens: int = 16384
    # None: the artifact's serving default (the batch size kiln bench's sweep found fastest), else 64; resolved
    # per model before its batcher starts (serve.inference.load_served)
    max_batch_size: int | None = None
    max_delay_s: float = 0.005
    window: int = 256  # features sorted together when choosing the next batch, at most
    # ... from at most this many of the oldest requests: a request is overtaken only by the ones within it. Measured
    # with benchmarks/serve_load.py (MiniLM int8, 64 clients, 2-core EPYC): 256 gave p99 697-791 ms, 32 620-632 ms
    # and 24 565 ms at the same throughput (within its ±10% noise); inputs of one request group freely. With the
    # partition on padded widths (benchmarks/experiments/serve_window/run.py at 91ffdaf, 2026-11-28, three
    # alternations): 32 187.8 req/s at p99 545 ms, 24 183.2 at 532, 16 179.0 at 474: below ~24 a narrower window buys
    # the tail with throughput (more padding), as a simulation of the batcher also finds
    # (serve_partition/closed_loop.py).
    window_requests: int = 32
    # An engine call's fixed cost, in padded tokens (kiln.runtime.batch_plan has the measurements). Served
    # (benchmarks/experiments/serve_variants at 91ffdaf, callN): 24 and 64 gave the same requests/s, 160 4% fewer
    # (wider-spread batches pad more than the calls they save).
    call_overhead_tokens: int = RUN_TOKENS

    @property
    def batch_cap(self) -> int:
        """The most inputs in one batch: ``max_batch_size``, else kiln's default."""
        return self.max_batch_size or DEFAULT_MAX_BATCH


def partition(lengths: Sequence[int], limits: BatchLimits) -> list[tuple[int, int]]:
    """Cut sorted ``lengths`` into contiguous [start, end) groups of least total cost (see the module doc)."""
    return least_cost_groups(lengths, limits.batch_cap, run_tokens=limits.call_overhead_tokens,
                             max_tokens=limits.max_batch_tokens)


def next_group(widths: Sequence[int], limits: BatchLimits, anchor: int = 0) -> list[int]:
    """The next batch of a window of waiting features, given their padded widths in arrival order (index 0 is the
    oldest): indices of the least-cost group of the width-sorted window that holds feature ``anchor`` (the one
    due first), in width order."""
    order = sorted(range(len(widths)), key=widths.__getitem__)  # stable: arrival order within a width
    at = order.index(anchor)
    start, end = next(g for g in partition([widths[k] for k in order], limits) if g[0] <= at < g[1])
    return order[start:end]


@dataclass(frozen=True)
class BatchTrace:
    """When one batch holding a request's inputs was formed, started on an engine and finished (perf_counter)."""

    arrived: float  # the request's submission
    formed: float
    started: float
    finished: float
    size: int


@dataclass
class _Request:
    future: asyncio.Future
    results: list[Any]
    remaining: int
    request_id: str | None = None
    traces: list[BatchTrace] | None = None
    shadowed: bool = False  # its served outputs go to the shadow (kiln.serving.shadow) once answered
    alone: bool = False  # it arrived with nothing queued or running: it may run on all cores (Batcher's solo)
    tokens: bool = False  # it asks for per-token vectors (the task's token_states) instead of reduced outputs


@dataclass(eq=False)  # an item is itself: compared by identity
class _Item:
    # The feature's length padded to the engine's multiple (as collate will), so that the partition costs what the
    # engine runs: on raw lengths it cut groups that collation then padded further. MiniLM int8 on OpenVINO
    # (multiple 16), 64 clients: served batches padded these texts to 117.5-118.0 tokens per input; a replay of the
    # partition over windows of 32 (benchmarks/experiments/serve_partition/run.py at 91ffdaf) gives 117.9 on raw lengths
    # and 113.0 on padded ones (sorted batches of 8: 111.8), and the server then measured 112.9-113.5.
    width: int
    arrived: float
    encoding: Encoding
    request: _Request
    slot: int


def _window_size(pending: list[_Item], limits: BatchLimits) -> int:
    """How many of the oldest ``pending`` features the next batch is chosen from: those of the oldest
    ``window_requests`` requests, at most ``window`` features."""
    seen: set[int] = set()
    for k, item in enumerate(pending[: limits.window]):
        seen.add(id(item.request))
        if len(seen) > limits.window_requests:
            return k
    return min(len(pending), limits.window)


@dataclass(frozen=True)
class BatchStats:
    size: int
    tokens: int  # padded cost: longest x count
    queue_seconds: float  # oldest feature's wait
    inference_seconds: float


class Pace:
    """How long a served batch of a given width runs: moving averages of the batches' size and seconds per padded
    token. ``due`` orders waiting features by when their answer is due (see the module doc).

    Measured with the batcher's simulation (benchmarks/experiments/serve_partition/closed_loop.py at 91ffdaf, 64
    closed-loop clients, the serving mix, 4 seeds): at equal throughput, p99 531 -> 513 ms with a window of 24 requests
    and 573 -> 549 with 32, against ordering by arrival alone; the tail is mostly long texts, whose batches run longest.
    Served (benchmarks/experiments/serve_ab/run.py at 91ffdaf, MiniLM int8, 2-core EPYC, window 32): p99 517 -> 500 and
    534 -> 503 ms in two runs of 4 alternations, requests/s within the runs' spread.

    Written on the event loop (each finished batch), read on the former thread: a read between the two fields'
    updates mixes an old and a new average, which only shifts one choice slightly.
    """

    SMOOTHING = 0.05  # each batch's weight: the figure follows the load over ~20 batches

    def __init__(self) -> None:
        self.size = 0.0
        self.seconds_per_token = 0.0  # 0 until a batch has run: features are then due in arrival order

    def observe(self, stats: BatchStats) -> None:
        if stats.tokens <= 0:
            return
        per_token = stats.inference_seconds / stats.tokens
        if self.size == 0.0:
            self.size, self.seconds_per_token = float(stats.size), per_token
            return
        self.size += self.SMOOTHING * (stats.size - self.size)
        self.seconds_per_token += self.SMOOTHING * (per_token - self.seconds_per_token)

    def due(self, arrived: float, width: int) -> float:
        """When a feature's batch should start for its answer to come as soon as an older narrow one's."""
        return arrived - width * self.size * self.seconds_per_token

    def first_due(self, arrived: Sequence[float], widths: Sequence[int]) -> int:
        """The index of the feature due first among features of these arrival times and padded widths."""
        return min(range(len(widths)), key=lambda k: self.due(arrived[k], widths[k]))


class Batcher(OwnedLoop):
    kind = "batcher"

    def __init__(self, predictor: Predictor, limits: BatchLimits,
                 on_batch: Callable[[BatchStats], None] = lambda stats: None,
                 extra_sessions: Sequence[Engine] = ()) -> None:
        super().__init__()
        self.predictor = predictor
        # With several sessions, the predictor's session of all cores: a batch made only of requests that found
        # the server idle runs there, holding every session (one request should not wait on one core while the
        # others idle). Requests that arrive while anything runs take the single-thread sessions as before.
        self.solo = predictor.solo if extra_sessions else None
        self.limits = limits
        self.on_batch = on_batch
        self.pace = Pace()
        self._pending: list[_Item] = []  # in arrival order
        self._wakeup = asyncio.Event()
        # Session 0 is the predictor's own engine, read at call time (so a wrapped engine is honoured).
        self._sessions = Sessions([lambda: predictor.engine, *((lambda e=e: e) for e in extra_sessions)],
                                  self.solo)
        self._former = ThreadPoolExecutor(max_workers=1, thread_name_prefix="kiln-batch-former")
        self._slots = asyncio.Semaphore(len(self._sessions) + 1)  # a batch per session and one prefetched
        self._busy = 0  # batches taken and not finished
        self._slot_held = False  # the loop holds a slot for the batch it is forming (given back if it dies)
        self._running: set[asyncio.Task] = set()
        self.idle = asyncio.Event()  # set while nothing is queued or running: when a shadow may use the CPU
        self.idle.set()
        self.shadow: Any = None  # kiln.serving.shadow.Shadow when --shadow-rate is given

    @property
    def sessions(self) -> int:
        return len(self._sessions)

    @property
    def batch_cap(self) -> int:
        """The most inputs one engine call takes."""
        return self.limits.batch_cap

    async def warmup(self) -> None:
        """Warm every session on the thread that will run it (runtimes keep per-thread state), each padded
        length bucket included where the engine builds kernels per shape."""
        warm = partial(warm_every_length, max_length=self.predictor.encoder.max_length,
                       multiple=self.predictor.pad_multiple)
        for index in range(len(self._sessions)):
            await self._sessions.run_on(index, warm)
        if self.solo is not None:
            await self._sessions.run_solo(warm)

    async def submit(self, encodings: Sequence[Encoding], traces: list[BatchTrace] | None = None, *,
                     tokens: bool = False) -> list[Any]:
        """Reduced outputs per encoding, in order. Cancelling the awaiting task drops the request's work.
        ``traces``, when given, receives a :class:`BatchTrace` per batch that ran some of these encodings.
        ``tokens``: per-token vectors instead (the task's ``token_states``); such a request shares batches with the
        others, and is not shadowed (the live figure compares reduced outputs)."""
        if self._closing:
            raise RuntimeError("the batcher is shutting down")
        self.check_alive()
        future = asyncio.get_running_loop().create_future()
        shadowed = self.shadow is not None and not tokens and self.shadow.config.sample()
        alone = self._busy == 0 and not self._pending
        request = _Request(future, [None] * len(encodings), len(encodings), request_id.get(), traces, shadowed,
                           alone, tokens)
        self.idle.clear()
        now = time.perf_counter()
        multiple = self.predictor.pad_multiple
        for slot, encoding in enumerate(encodings):
            self._pending.append(_Item(padded_width(len(encoding.ids), multiple), now, encoding, request, slot))
        self._wakeup.set()
        return await future

    async def close(self) -> None:
        """Finish every accepted request, then stop."""
        self._closing = True
        self._wakeup.set()
        await self._join()
        if self._running:
            await asyncio.gather(*self._running, return_exceptions=True)
        await asyncio.get_running_loop().run_in_executor(None, self._sessions.close)
        self._former.shutdown(wait=True)

    def fail_pending(self, err: Exception) -> None:
        """Every queued request gets ``err`` (batches already taken answer their own requests)."""
        pending, self._pending = self._pending, []
        if self._slot_held:  # a restarted loop must find the slot its predecessor was forming a batch in
            self._slot_held = False
            self._slots.release()
        for item in pending:
            if not item.request.future.done():
                item.request.future.set_exception(err)

    def _choose(self, window: list[_Item]) -> tuple[list[_Item], dict[str, Any] | Exception]:
        """The next batch and its arrays: the least-cost group of the width-sorted ``window`` (in arrival order)
        that holds the feature due first (Pace). Runs on the former thread.

        A collation error belongs to this batch alone (returned, so only its requests fail); an error in the
        partition search is the batcher's own bug and ends the loop (heard by its supervision)."""
        widths = [i.width for i in window]
        anchor = self.pace.first_due([i.arrived for i in window], widths)
        batch = [window[k] for k in next_group(widths, self.limits, anchor)]
        try:
            return batch, self._collate(batch)
        except Exception as err:
            return batch, err

    def _ready(self) -> bool:
        if not self._pending:
            return False
        if self._closing or self._busy < len(self._sessions) or len(self._pending) >= self.limits.batch_cap:
            return True
        widest = max(i.width for i in self._pending)
        if widest * len(self._pending) >= self.limits.max_batch_tokens:
            return True
        return time.perf_counter() - self._pending[0].arrived >= self.limits.max_delay_s

    async def _loop(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            await self._slots.acquire()  # the running batch and one prefetched; formed as late as possible
            self._slot_held = True
            while True:
                self._pending = [i for i in self._pending if not i.request.future.done()]  # client gone: drop
                if self._ready():
                    break
                if not self._pending and self._busy == 0:
                    self.idle.set()  # every queued client went away: nothing runs
                if self._closing and not self._pending:
                    self._slot_held = False
                    self._slots.release()
                    return
                self._wakeup.clear()
                timeout = None
                if self._pending:  # wake when the oldest waiting feature has waited max_delay
                    timeout = max(0.0, self.limits.max_delay_s - (time.perf_counter() - self._pending[0].arrived))
                try:
                    await asyncio.wait_for(self._wakeup.wait(), timeout=timeout)
                except asyncio.TimeoutError:
                    pass
            size = _window_size(self._pending, self.limits)
            batch, arrays = await loop.run_in_executor(self._former, self._choose, self._pending[:size])
            chosen = {id(i) for i in batch}  # only the window's first `size` items can have been chosen
            self._pending = [i for i in self._pending[:size] if id(i) not in chosen] + self._pending[size:]
            self._busy += 1
            self._slot_held = False  # the batch's task releases it
            task = loop.create_task(self._run(batch, arrays))
            self._running.add(task)
            task.add_done_callback(self._running.discard)

    def _collate(self, batch: list[_Item]) -> dict[str, Any]:
        return self.predictor.encoder.collate([i.encoding for i in batch], multiple=self.predictor.pad_multiple)

    def _forward(self, engine: Engine, arrays: dict[str, Any], tokens: Sequence[bool] = ()) -> list[Any]:
        """The forward pass and the task's pooling, both on the session's thread (off the event loop); the rows
        ``tokens`` marks get their per-token vectors instead."""
        handler = self.predictor.handler
        if not any(tokens):
            return handler.run_batch(engine, arrays)
        outputs = engine.run(arrays)
        reduced, states = handler.reduce_arrays(outputs, arrays), handler.token_states(outputs, arrays)
        return [state if wanted else value for value, state, wanted in zip(reduced, states, tokens)]

    def _execute(self, batch: list[_Item], arrays: dict[str, Any], engine: Engine
                 ) -> tuple[list[_Item], dict[str, Any], list[Any], float, float] | None:
        """On the session's thread, when it takes the batch: drop the features whose client went away (recollating
        the rest; None when none is left, so it costs nothing), then run it: (batch, arrays, outputs, start, end)."""
        live = [i for i in batch if not i.request.future.done()]
        if not live:
            return None
        if len(live) < len(batch):
            batch, arrays = live, self._collate(live)
        start = time.perf_counter()
        reduced = self._forward(engine, arrays, [i.request.tokens for i in batch])
        return batch, arrays, reduced, start, time.perf_counter()

    async def _run(self, batch: list[_Item], arrays: dict[str, Any] | Exception) -> None:
        try:
            if isinstance(arrays, Exception):
                raise arrays
            formed = time.perf_counter()
            queued = formed - min(i.arrived for i in batch)
            # All cores for it only if it is the one batch in flight, nothing is queued, and each of its requests
            # found the server idle (Sessions checks that every session is idle when it hands it over).
            alone = self._busy == 1 and not self._pending and all(i.request.alone for i in batch)
            job = Job(partial(self._execute, batch, arrays), asyncio.get_running_loop().create_future(), alone)
            self._sessions.dispatch(job)
            ran = await job.done
            if ran is None:
                return  # every client went away while the batch waited
            batch, arrays, reduced, start, finished = ran
            stats = BatchStats(len(batch), int(arrays["input_ids"].size), queued, finished - start)
            self.pace.observe(stats)
            self.on_batch(stats)
            if self.shadow is not None:
                sampled = [(i.encoding, value) for i, value in zip(batch, reduced) if i.request.shadowed]
                if sampled:
                    self.shadow.offer(sampled)
            for item, value in zip(batch, reduced):
                request = item.request
                request.results[item.slot] = value
                request.remaining -= 1
                if request.traces is not None and (not request.traces or request.traces[-1].formed != formed):
                    request.traces.append(BatchTrace(item.arrived, formed, start, finished, len(batch)))
                if request.remaining == 0 and not request.future.done():
                    request.future.set_result(request.results)
        except BaseException as err:  # every request in a failed batch gets the error; none is left hanging
            ids = sorted({i.request.request_id for i in batch if i.request.request_id})
            if isinstance(err, Exception):
                log.error("a batch of %d inputs failed (requests: %s): %s: %s", len(batch), ", ".join(ids) or "-",
                          type(err).__name__, err, exc_info=err)
            failure = err if isinstance(err, Exception) else RuntimeError(f"the batch was cancelled ({err!r})")
            for item in batch:
                if not item.request.future.done():
                    item.request.future.set_exception(failure)
            if not isinstance(err, Exception):
                raise
        finally:
            self._busy -= 1
            self._slots.release()
            self._wakeup.set()  # the engine may now be idle: a waiting batch can go at once
            if self._busy == 0 and not self._pending:
                self.idle.set()
