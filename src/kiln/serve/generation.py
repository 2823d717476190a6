"""Serving a decoder: a step loop with continuous batching, and the /generate and /v1/completions endpoints.

One asyncio task owns the running batch (``DecodeLoop``). Each round it either prefills the requests waiting for
a slot (they join the batch and get their first token) or runs one decoding step for every running sequence; the
step itself runs on the engine's own thread. A sequence that finishes leaves the batch at once and its slot goes
to the next waiting one; a request whose client went away (the Guard cancels its handler) is dropped before the
next round, so it stops costing compute. Tokens reach each request through its own queue, as server-sent events
when it asked to stream.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections import deque
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import orjson
from fastapi import FastAPI
from fastapi.responses import StreamingResponse

from kiln.decoder.batch import DecodeBatch, Decoding, Emitted, new_sequence
from kiln.decoder.generate import prompt_ids
from kiln.errors import UsageError
from kiln.log import get_logger
from kiln.runtime.predictor import Predictor
from kiln.serve.batcher import BatchLimits
from kiln.serve.endpoints import HTTPError, JSONBody, picked, post_endpoint
from kiln.serve.schemas import INFERENCE_ERRORS
from kiln.serve.supervision import OwnedLoop
from kiln.tasks.http import Route

log = get_logger("serve.generation")
DEFAULT_SLOTS = 32  # sequences decoding together when --max-batch-size is not given


@dataclass
class Stream:
    """One prompt's place in the loop: the events for its request, and whether the request still wants them."""

    prompt: list[int]
    events: asyncio.Queue = field(default_factory=asyncio.Queue)
    cancelled: bool = False
    sequence: Decoding | None = None


class DecodeLoop(OwnedLoop):
    """Continuous batching for one decoder model (what the Batcher is for one-pass tasks)."""

    kind = "decode"

    def __init__(self, predictor: Predictor, limits: BatchLimits) -> None:
        super().__init__()
        self.predictor = predictor
        self.slots = self.batch_cap = limits.max_batch_size or DEFAULT_SLOTS  # sequences decoding together
        self.batch = DecodeBatch(predictor.engine.steps, predictor.encoder.pad_id)
        self.waiting: deque[tuple[Stream, Any]] = deque()
        self.thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="kiln-decode")
        self._wakeup = asyncio.Event()
        self.steps = 0  # decoding rounds run (prefills and steps), for tests and /metrics
        self.widest = 0  # most sequences that decoded in one step

    async def warmup(self) -> None:
        await asyncio.get_running_loop().run_in_executor(self.thread, self.predictor.engine.warmup)

    def submit(self, prompt: list[int], options: Any) -> Stream:
        if self._closing:
            raise HTTPError(503, "not_ready", "the server is shutting down")
        self.check_alive()
        stream = Stream(prompt)
        self.waiting.append((stream, options))
        self._wakeup.set()
        return stream

    async def close(self) -> None:
        """Finish every accepted request, then stop."""
        self._closing = True
        self._wakeup.set()
        await self._join()
        self.thread.shutdown(wait=True)

    def fail_pending(self, err: Exception) -> None:
        """Every waiting and decoding stream gets ``err``; the loop's batch starts empty if it is restarted."""
        waiting, self.waiting = [stream for stream, _ in self.waiting], deque()
        self._fail_batch(err, waiting)

    def _fail_batch(self, err: Exception, others: list[Stream]) -> None:
        """``err`` to every stream in the batch and to ``others``; the batch starts again empty."""
        for stream in [s.owner for s in self.batch.sequences] + others:
            stream.events.put_nowait(err)
        self.batch = DecodeBatch(self.predictor.engine.steps, self.predictor.encoder.pad_id)

    async def _loop(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            self._drop_cancelled()
            if not self.waiting and not len(self.batch):
                if self._closing:
                    return
                self._wakeup.clear()
                await self._wakeup.wait()
                continue
            room = self.slots - len(self.batch)
            joining = [self.waiting.popleft() for _ in range(min(room, len(self.waiting)))]
            try:
                if joining:
                    sequences = []
                    for stream, options in joining:
                        stream.sequence = new_sequence(stream.prompt, options.sampling, options.stops,
                                                       self.predictor.encoder.decode, owner=stream)
                        sequences.append(stream.sequence)
                    emitted = await loop.run_in_executor(self.thread, self.batch.add, sequences)
                else:
                    self.widest = max(self.widest, len(self.batch))
                    emitted = await loop.run_in_executor(self.thread, self.batch.step)
            except Exception as err:  # every sequence in the batch gets the error; the loop goes on empty
                log.error("a decoding round of %d sequences failed: %s: %s", len(self.batch) + len(joining),
                          type(err).__name__, err, exc_info=err)
                self._fail_batch(err, [stream for stream, _ in joining])
                continue
            self.steps += 1
            for e in emitted:
                e.sequence.owner.events.put_nowait(e)
            self.batch.remove([e.sequence for e in emitted if e.finished])

    def _drop_cancelled(self) -> None:
        self.waiting = deque((s, o) for s, o in self.waiting if not s.cancelled)
        gone = [s for s in self.batch.sequences if s.owner.cancelled]
        if gone:
            self.batch.remove(gone)


async def events_of(stream: Stream) -> AsyncIterator[Emitted]:
    """The stream's emitted tokens until it finishes; cancelling the consumer frees its slot."""
    try:
        while True:
            event = await stream.events.get()
            if isinstance(event, Exception):
                raise HTTPError(500, "inference_failed", f"generation failed: {type(event).__name__}: {event}")
            yield event
            if event.finished:
                return
    finally:
        stream.cancelled = True  # no-op for a finished sequence (already out of the batch)


async def finished(stream: Stream) -> Any:
    """The stream's text once it has finished (its Detokenizer: text, ids, finish_reason)."""
    final = None
    async for event in events_of(stream):
        final = event
    return final.sequence.text


# -- HTTP ---------------------------------------------------------------------------------------------------------
def _sse(payload: Any) -> bytes:
    return b"data: " + (payload if isinstance(payload, bytes) else orjson.dumps(payload)) + b"\n\n"


async def _start(app: FastAPI, served: Any, body: Any) -> tuple[list[Stream], list[int]]:
    config = app.state.config
    prompts = body.prompts()
    if len(prompts) > config.max_inputs_per_request:
        raise HTTPError(413, "too_many_inputs", f"{len(prompts)} prompts in one request; the limit is "
                        f"{config.max_inputs_per_request} (--max-inputs-per-request)")
    predictor: Predictor = served.predictor
    try:
        options = predictor.handler.options(**body.options())
        ids = await asyncio.get_running_loop().run_in_executor(
            app.state.pool, prompt_ids, predictor, prompts, options.stops.max_new_tokens)
    except UsageError as err:
        raise HTTPError(422, "invalid_request", err.message) from err
    loop: DecodeLoop = served.scheduler
    return [loop.submit(p, options) for p in ids], [len(p) for p in ids]


async def _generate(app: FastAPI, served: Any, body: Any) -> Any:
    (stream,), (prompt_tokens,) = await _start(app, served, body)
    if body.stream:
        async def events() -> AsyncIterator[bytes]:
            async for e in events_of(stream):
                text = e.sequence.text
                yield _sse({"token": {"id": e.token, "text": e.text}, "generated_text": text.text if e.finished
                            else None, "finish_reason": text.finish_reason})
        return StreamingResponse(events(), media_type="text/event-stream")
    text = await finished(stream)
    generated = len(text.ids) + (text.eos is not None)
    return {"model": served.name, "generated_text": text.text, "finish_reason": text.finish_reason,
            "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": generated,
                      "total_tokens": prompt_tokens + generated}}


async def _completions(app: FastAPI, served: Any, body: Any) -> Any:
    streams, prompt_tokens = await _start(app, served, body)
    head = {"id": f"cmpl-{uuid.uuid4().hex}", "object": "text_completion", "created": int(time.time()),
            "model": served.name}
    if body.stream:
        async def events() -> AsyncIterator[bytes]:
            queue: asyncio.Queue = asyncio.Queue()

            async def pump(index: int, stream: Stream) -> None:
                try:
                    async for e in events_of(stream):
                        await queue.put((index, e))
                except Exception as err:  # reaches the client as the stream's end, not a hang
                    await queue.put((index, err))

            pumps = [asyncio.ensure_future(pump(i, s)) for i, s in enumerate(streams)]
            try:
                done = 0
                while done < len(streams):
                    index, e = await queue.get()
                    if isinstance(e, Exception):
                        yield _sse({"error": {"type": "inference_failed", "message": str(e)}})
                        return
                    done += e.finished
                    yield _sse({**head, "choices": [{"text": e.text, "index": index, "logprobs": None,
                                                     "finish_reason": e.sequence.text.finish_reason}]})
                yield _sse(b"[DONE]")
            finally:
                for p in pumps:
                    p.cancel()
                for s in streams:
                    s.cancelled = True
        return StreamingResponse(events(), media_type="text/event-stream")
    choices, completion = [], 0
    try:
        for index, stream in enumerate(streams):
            text = await finished(stream)
            completion += len(text.ids) + (text.eos is not None)
            choices.append({"text": text.text, "index": index, "logprobs": None, "finish_reason": text.finish_reason})
    finally:
        for s in streams:
            s.cancelled = True
    total = sum(prompt_tokens)
    return {**head, "choices": choices,
            "usage": {"prompt_tokens": total, "completion_tokens": completion, "total_tokens": total + completion}}


ANSWERS = {"/generate": _generate, "/v1/completions": _completions}

STREAM_DOC = {200: {"content": {"text/event-stream": {"schema": {"type": "string"}}},
                    "description": "JSON, or with `stream: true` server-sent events (`data: {...}` per piece of "
                                   "text; /v1/completions ends with `data: [DONE]`)."}}


def mount_route(app: FastAPI, route: Route) -> None:
    """POST ``route.path``: JSON, or server-sent events with ``stream: true``."""
    answer = ANSWERS[route.path]

    async def endpoint(body: Any) -> Any:
        # A streamed answer's span ends when streaming starts (the first token is in it; later ones are not).
        with picked(app, body.model, route, stream=body.stream) as (served, _):
            result = await answer(app, served, body)
        return result if isinstance(result, StreamingResponse) else JSONBody(result)

    post_endpoint(app, route, endpoint, {**INFERENCE_ERRORS, **STREAM_DOC})


