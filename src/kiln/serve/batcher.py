"""The dynamic batcher: one asyncio task owns the queue and turns single requests into packed batches.

A batch closes when its padded cost (longest x count) would pass ``max_batch_tokens``, when it holds
``max_batch_size`` features, or when the oldest waiting feature has waited ``max_delay``. Waiting features are
sorted by length within a look-ahead window so batches hold similar lengths. Features of requests whose
client went away are dropped before they cost compute; if a batch fails, every request in it gets the error.
Engine calls run on one worker thread; the next batch is formed and collated while the current one runs.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from tokenizers import Encoding

from kiln.runtime import Predictor


@dataclass(frozen=True)
class BatchLimits:
    max_batch_tokens: int = 16384
    max_batch_size: int = 64
    max_delay_s: float = 0.005
    window: int = 256  # features sorted together when choosing the next batch


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


class Batcher:
    def __init__(self, predictor: Predictor, limits: BatchLimits,
                 on_batch: Callable[[BatchStats], None] = lambda stats: None) -> None:
        self.predictor = predictor
        self.limits = limits
        self.on_batch = on_batch
        self._pending: list[_Item] = []
        self._wakeup = asyncio.Event()
        self._engine_thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="kiln-engine")
        self._inflight = asyncio.Semaphore(2)  # the running batch and one prefetched
        self._task: asyncio.Task | None = None
        self._closing = False
        self._running: set[asyncio.Task] = set()

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._loop(), name="kiln-batcher")

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
        self._engine_thread.shutdown(wait=True)

    def _take_batch(self) -> list[_Item]:
        """The next batch: from the oldest-first window, sorted by length, within the token/size budget."""
        self._pending = [i for i in self._pending if not i.request.future.done()]  # client gone: drop
        window = sorted(self._pending[: self.limits.window])
        if not window:
            return []
        oldest = min(window, key=lambda i: i.arrived)
        start = window.index(oldest)  # grow around the oldest feature so it is never starved
        batch = [oldest]
        lo, hi = start - 1, start + 1
        while len(batch) < self.limits.max_batch_size:
            candidates = [c for c in (hi if hi < len(window) else None, lo if lo >= 0 else None) if c is not None]
            if not candidates:
                break
            pick = min(candidates, key=lambda c: abs(window[c].length - oldest.length))
            item = window[pick]
            longest = max(item.length, max(i.length for i in batch))
            if longest * (len(batch) + 1) > self.limits.max_batch_tokens:
                break
            batch.append(item)
            if pick == hi:
                hi += 1
            else:
                lo -= 1
        chosen = {id(i) for i in batch}
        self._pending = [i for i in self._pending if id(i) not in chosen]
        return batch

    def _ready(self) -> bool:
        if not self._pending:
            return False
        if self._closing or len(self._pending) >= self.limits.max_batch_size:
            return True
        longest = max(i.length for i in self._pending)
        if longest * len(self._pending) >= self.limits.max_batch_tokens:
            return True
        return time.perf_counter() - min(i.arrived for i in self._pending) >= self.limits.max_delay_s

    async def _loop(self) -> None:
        while True:
            if not self._pending:
                if self._closing:
                    return
                self._wakeup.clear()
                await self._wakeup.wait()
                continue
            if not self._ready():
                oldest = min(i.arrived for i in self._pending)
                delay = max(0.0, self.limits.max_delay_s - (time.perf_counter() - oldest))
                self._wakeup.clear()
                try:
                    await asyncio.wait_for(self._wakeup.wait(), timeout=delay)
                except asyncio.TimeoutError:
                    pass
                continue
            batch = self._take_batch()
            if not batch:
                continue
            await self._inflight.acquire()
            task = asyncio.get_running_loop().create_task(self._run(batch))
            self._running.add(task)
            task.add_done_callback(self._running.discard)

    async def _run(self, batch: list[_Item]) -> None:
        try:
            queued = time.perf_counter() - min(i.arrived for i in batch)
            arrays = self.predictor.encoder.collate([i.encoding for i in batch],
                                                    multiple=getattr(self.predictor.engine, "pad_multiple", 1))
            start = time.perf_counter()
            loop = asyncio.get_running_loop()
            outputs = await loop.run_in_executor(self._engine_thread, self.predictor.engine.run, arrays)
            reduced = self.predictor.handler.reduce(outputs, arrays["attention_mask"])
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
            self._inflight.release()
