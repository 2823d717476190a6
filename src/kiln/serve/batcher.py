"""The dynamic batcher: one asyncio task owns the queue and turns single requests into packed batches.

Which features go together: the look-ahead window (oldest first) is sorted by length and cut into contiguous
groups that minimise the total cost, sum over groups of (``call_overhead_tokens`` + longest x count), within
``max_batch_size`` and ``max_batch_tokens`` (padded cost) per group; the group holding the oldest feature runs
next, so nothing starves. On a CPU the per-token cost barely falls past batch ~8, so one 64-wide batch of mixed
lengths (half of it padding) is slower than several batches of similar lengths; the cost model makes that cut.

When a batch closes: at once when a session is idle (waiting cannot help a lone request); while every session runs,
the next one is formed and collated (prefetched) when it is full by size or tokens, or when its oldest feature
has waited ``max_delay``. Features of requests whose client went away are dropped before they cost compute; if
a batch fails, every request in it gets the error. Each session (engine instance, ``--sessions``) runs its
batches on its own thread; the event loop only forms batches and answers requests.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from tokenizers import Encoding

from kiln.engines.base import Engine, warm_every_length
from kiln.runtime.predictor import Predictor

DEFAULT_MAX_BATCH = 64


@dataclass(frozen=True)
class BatchLimits:
    max_batch_tokens: int = 16384
    # None: the artifact's serving default (the batch size kiln bench's sweep found fastest), else 64; resolved
    # per model before its batcher starts (serve.inference.load_served)
    max_batch_size: int | None = None
    max_delay_s: float = 0.005
    window: int = 256  # features sorted together when choosing the next batch
    call_overhead_tokens: int = 64  # an engine call's fixed cost, in padded tokens (measured: 30-90 on CPU)

    @property
    def batch_cap(self) -> int:
        """The most inputs in one batch: ``max_batch_size``, else kiln's default."""
        return self.max_batch_size or DEFAULT_MAX_BATCH


def partition(lengths: Sequence[int], limits: BatchLimits) -> list[tuple[int, int]]:
    """Cut sorted ``lengths`` into contiguous [start, end) groups of least total cost (see the module doc)."""
    n = len(lengths)
    best = [0.0] + [float("inf")] * n  # best[j]: least cost of the first j features
    cut = [0] * (n + 1)
    for j in range(1, n + 1):
        longest = lengths[j - 1]
        for i in range(j - 1, max(0, j - limits.batch_cap) - 1, -1):
            padded = longest * (j - i)
            if padded > limits.max_batch_tokens and i < j - 1:
                break  # a single feature always fits (the tokenizer truncated it to the model's maximum)
            cost = best[i] + limits.call_overhead_tokens + padded
            if cost < best[j]:
                best[j], cut[j] = cost, i
    groups = []
    j = n
    while j > 0:
        groups.append((cut[j], j))
        j = cut[j]
    return groups[::-1]


@dataclass
class _Request:
    future: asyncio.Future
    results: list[Any]
    remaining: int


@dataclass(order=True)
class _Item:
    length: int
    arrived: float = field(compare=False)
    encoding: Encoding = field(compare=False)
    request: _Request = field(compare=False)
    slot: int = field(compare=False)


@dataclass(frozen=True)
class BatchStats:
    size: int
    tokens: int  # padded cost: longest x count
    queue_seconds: float  # oldest feature's wait
    inference_seconds: float


class _Session:
    """One engine instance and the one thread that runs it. Session 0 is the predictor's own engine, read at
    call time (so a wrapped engine is honoured); further sessions own theirs."""

    def __init__(self, engine: Engine | None, index: int) -> None:
        self.engine = engine
        self.thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"kiln-engine-{index}")


class Batcher:
    def __init__(self, predictor: Predictor, limits: BatchLimits,
                 on_batch: Callable[[BatchStats], None] = lambda stats: None,
                 extra_sessions: Sequence[Engine] = ()) -> None:
        self.predictor = predictor
        self.limits = limits
        self.on_batch = on_batch
        self._pending: list[_Item] = []
        self._wakeup = asyncio.Event()
        self._sessions = [_Session(None, 0)] + [_Session(e, i + 1) for i, e in enumerate(extra_sessions)]
        self._free: asyncio.Queue[_Session] = asyncio.Queue()  # sessions with no batch on them
        for session in self._sessions:
            self._free.put_nowait(session)
        self._slots = asyncio.Semaphore(len(self._sessions) + 1)  # a batch per session and one prefetched
        self._busy = 0  # batches taken and not finished
        self._task: asyncio.Task | None = None
        self._closing = False
        self._running: set[asyncio.Task] = set()

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._loop(), name="kiln-batcher")

    @property
    def sessions(self) -> int:
        return len(self._sessions)

    def _engine(self, session: _Session) -> Engine:
        return session.engine or self.predictor.engine

    async def warmup(self) -> None:
        """Warm every session on the thread that will run it (runtimes keep per-thread state), each padded
        length bucket included where the engine builds kernels per shape."""
        loop = asyncio.get_running_loop()
        max_length = self.predictor.encoder.max_length
        for session in self._sessions:
            await loop.run_in_executor(session.thread, warm_every_length, self._engine(session), max_length,
                                       self.predictor.pad_multiple)

    async def submit(self, encodings: Sequence[Encoding]) -> list[Any]:
        """Reduced outputs per encoding, in order. Cancelling the awaiting task drops the request's work."""
        if self._closing:
            raise RuntimeError("the batcher is shutting down")
        future = asyncio.get_running_loop().create_future()
        request = _Request(future, [None] * len(encodings), len(encodings))
        now = time.perf_counter()
        for slot, encoding in enumerate(encodings):
            self._pending.append(_Item(len(encoding.ids), now, encoding, request, slot))
        self._wakeup.set()
        return await future

    async def close(self) -> None:
        """Finish every accepted request, then stop."""
        self._closing = True
        self._wakeup.set()
        if self._task is not None:
            await self._task
        if self._running:
            await asyncio.gather(*self._running, return_exceptions=True)
        for session in self._sessions:
            session.thread.shutdown(wait=True)

    def _take_batch(self) -> list[_Item]:
        """The next batch: the least-cost group (of the length-sorted window) that holds the oldest feature."""
        self._pending = [i for i in self._pending if not i.request.future.done()]  # client gone: drop
        window = sorted(self._pending[: self.limits.window])
        if not window:
            return []
        oldest = min(range(len(window)), key=lambda k: window[k].arrived)
        start, end = next(g for g in partition([i.length for i in window], self.limits) if g[0] <= oldest < g[1])
        batch = window[start:end]
        chosen = {id(i) for i in batch}
        self._pending = [i for i in self._pending if id(i) not in chosen]
        return batch

    def _ready(self) -> bool:
        if not self._pending:
            return False
        if self._closing or self._busy < len(self._sessions) or len(self._pending) >= self.limits.batch_cap:
            return True
        longest = max(i.length for i in self._pending)
        if longest * len(self._pending) >= self.limits.max_batch_tokens:
            return True
        return time.perf_counter() - min(i.arrived for i in self._pending) >= self.limits.max_delay_s

    async def _loop(self) -> None:
        while True:
            await self._slots.acquire()  # the running batch and one prefetched; formed as late as possible
            while not self._ready():
                if self._closing and not self._pending:
                    self._slots.release()
                    return
                self._wakeup.clear()
                timeout = None
                if self._pending:  # wake when the oldest waiting feature has waited max_delay
                    oldest = min(i.arrived for i in self._pending)
                    timeout = max(0.0, self.limits.max_delay_s - (time.perf_counter() - oldest))
                try:
                    await asyncio.wait_for(self._wakeup.wait(), timeout=timeout)
                except asyncio.TimeoutError:
                    pass
            batch = self._take_batch()
            if not batch:
                self._slots.release()
                continue
            self._busy += 1
            task = asyncio.get_running_loop().create_task(self._run(batch))
            self._running.add(task)
            task.add_done_callback(self._running.discard)

    def _collate(self, batch: list[_Item]) -> dict[str, Any]:
        return self.predictor.encoder.collate([i.encoding for i in batch], multiple=self.predictor.pad_multiple)

    def _forward(self, engine: Engine, arrays: dict[str, Any]) -> list[Any]:
        """The forward pass and the task's pooling, both on the session's thread (off the event loop)."""
        return self.predictor.handler.reduce(engine.run(arrays), arrays["attention_mask"])

    async def _run(self, batch: list[_Item]) -> None:
        try:
            queued = time.perf_counter() - min(i.arrived for i in batch)
            arrays = self._collate(batch)  # prefetch: ready before a session is free
            session = await self._free.get()
            try:
                live = [i for i in batch if not i.request.future.done()]
                if not live:
                    return  # every client went away while the batch waited: it costs nothing
                if len(live) < len(batch):
                    batch, arrays = live, self._collate(live)
                start = time.perf_counter()
                loop = asyncio.get_running_loop()
                reduced = await loop.run_in_executor(session.thread, self._forward, self._engine(session), arrays)
            finally:
                self._free.put_nowait(session)
            self.on_batch(BatchStats(len(batch), int(arrays["input_ids"].size), queued, time.perf_counter() - start))
            for item, value in zip(batch, reduced):
                request = item.request
                request.results[item.slot] = value
                request.remaining -= 1
                if request.remaining == 0 and not request.future.done():
                    request.future.set_result(request.results)
        except Exception as err:  # every request in a failed batch gets the error; none is left hanging
            for item in batch:
                if not item.request.future.done():
                    item.request.future.set_exception(err)
        finally:
            self._busy -= 1
            self._slots.release()
            self._wakeup.set()  # the engine may now be idle: a waiting batch can go at once
