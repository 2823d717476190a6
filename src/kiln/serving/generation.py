"""Serving a decoder: a step loop with continuous batching, and the /generate, /v1/completions and
/v1/chat/completions endpoints.

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
from collections.abc import AsyncIterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from typing import Any

import orjson
from fastapi import FastAPI
from fastapi.responses import StreamingResponse

from kiln.choices import KILN_PREFIX
from kiln.decoder.batch import DecodeBatch, Decoding, Emitted, new_sequence
from kiln.decoder.beam import BeamSearch
from kiln.decoder.chat import prompt_texts
from kiln.decoder.generate import Generated, copies_of, from_hypothesis, generated_of, prompt_ids
from kiln.decoder.logprobs import TokenLogprob
from kiln.errors import UsageError
from kiln.log import get_logger
from kiln.runtime.predictor import Predictor
from kiln.serving.batcher import BatchLimits
from kiln.serving.endpoints import HTTPError, JSONBody, picked, post_endpoint
from kiln.serving.schemas import INFERENCE_ERRORS
from kiln.serving.supervision import OwnedLoop
from kiln.tasks.wire.http import Route

log = get_logger("serve.generation")
DEFAULT_SLOTS = 32  # sequences decoding together when --max-batch-size is not given


@dataclass
class Stream:
    """One continuation's place in the loop: the events for its request, and whether the request still wants them.
    A sampled or greedy one decodes in the batch (``sequence``); a beam search runs beside it (``search``)."""

    prompt: list[int]
    options: Any
    events: asyncio.Queue = field(default_factory=asyncio.Queue)
    cancelled: bool = False
    sequence: Decoding | None = None
    search: BeamSearch | None = None

    @property
    def width(self) -> int:
        """Rows of a step it takes: one, or one per beam."""
        return self.options.beams.num_beams


@dataclass(frozen=True)
class Searched:
    """The end of a beam search: its best continuations, best first (the last event of its stream)."""

    results: list[Generated]
    finished: bool = True


class DecodeLoop(OwnedLoop):
    """Continuous batching for one decoder model (what the Batcher is for one-pass tasks).

    Beam searches run beside the batch, one step each per round on a stepper of their own (their cache is theirs:
    BeamSearch keeps it as numpy between steps), so a search neither waits for the batch to empty nor stalls it;
    each takes ``num_beams`` of the loop's slots."""

    kind = "decode"

    def __init__(self, predictor: Predictor, limits: BatchLimits) -> None:
        super().__init__()
        self.predictor = predictor
        self.slots = self.batch_cap = limits.max_batch_size or DEFAULT_SLOTS  # rows decoding together
        self.batch = DecodeBatch(predictor.engine.steps, predictor.encoder.pad_id)
        self.beam_steps = predictor.engine.new_stepper()
        self.searches: list[Stream] = []
        self.waiting: deque[Stream] = deque()
        self.thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="kiln-decode")
        self._wakeup = asyncio.Event()
        self.steps = 0  # decoding rounds run (prefills and steps), for tests and /metrics
        self.widest = 0  # most rows (sequences and beams) that decoded in one round

    async def warmup(self) -> None:
        await asyncio.get_running_loop().run_in_executor(self.thread, self.predictor.engine.warmup)

    def submit(self, prompt: list[int], options: Any) -> Stream:
        if self._closing:
            raise HTTPError(503, "not_ready", "the server is shutting down")
        self.check_alive()
        stream = Stream(prompt, options)
        self.waiting.append(stream)
        self._wakeup.set()
        return stream

    @property
    def occupied(self) -> int:
        return len(self.batch) + sum(s.width for s in self.searches)

    async def close(self) -> None:
        """Finish every accepted request, then stop."""
        self._closing = True
        self._wakeup.set()
        await self._join()
        self.thread.shutdown(wait=True)

    def fail_pending(self, err: Exception) -> None:
        """Every waiting and decoding stream gets ``err``; the loop's batch starts empty if it is restarted."""
        waiting, self.waiting = list(self.waiting), deque()
        self._fail_batch(err, waiting)

    def _fail_batch(self, err: Exception, others: list[Stream]) -> None:
        """``err`` to every stream in the batch and the searches and to ``others``; the batch starts again empty."""
        for stream in [s.owner for s in self.batch.sequences] + self.searches + others:
            stream.events.put_nowait(err)
        self.searches = []
        self.batch = DecodeBatch(self.predictor.engine.steps, self.predictor.encoder.pad_id)

    def _admit(self) -> list[Stream]:
        """The waiting streams that fit the free slots, first come first served (a search wider than the slots
        still runs when nothing else does)."""
        joining, room = [], self.slots - self.occupied
        while self.waiting and (self.waiting[0].width <= room or not (self.occupied or joining)):
            stream = self.waiting.popleft()
            room -= stream.width
            joining.append(stream)
        decode = self.predictor.encoder.decode
        for stream in joining:
            o = stream.options
            if o.beams.active:
                stream.search = BeamSearch(self.beam_steps, stream.prompt, o.beams, o.stops.max_new_tokens,
                                           o.stops.eos_ids, o.sampling.repetition_penalty, owner=stream)
                self.searches.append(stream)
            else:
                stream.sequence = new_sequence(stream.prompt, o.sampling, o.stops, decode, stream, o.logprobs)
        return [s for s in joining if s.sequence is not None]

    def _round(self, joining: list[Stream]) -> tuple[list[Emitted], list[Stream]]:
        """One round on the decode thread: the joiners' prefill or a step of the batch, and a step of every search."""
        self.widest = max(self.widest, self.occupied)
        if joining:
            emitted = self.batch.add([s.sequence for s in joining])
        elif len(self.batch):
            emitted = self.batch.step()
        else:
            emitted = []
        ended = [s for s in self.searches if s.search.advance()]
        return emitted, ended

    async def _loop(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            self._drop_cancelled()
            if not self.waiting and not len(self.batch) and not self.searches:
                if self._closing:
                    return
                self._wakeup.clear()
                await self._wakeup.wait()
                continue
            joining = self._admit()
            try:
                emitted, ended = await loop.run_in_executor(self.thread, self._round, joining)
            except Exception as err:  # every sequence in the batch gets the error; the loop goes on empty
                log.error("a decoding round of %d sequences and %d beam searches failed: %s: %s",
                          len(self.batch) + len(joining), len(self.searches), type(err).__name__, err, exc_info=err)
                self._fail_batch(err, joining)
                continue
            self.steps += 1
            for e in emitted:
                e.sequence.owner.events.put_nowait(e)
            self.batch.remove([e.sequence for e in emitted if e.finished])
            for stream in ended:
                self.searches.remove(stream)
                o, decode = stream.options, self.predictor.encoder.decode
                stream.events.put_nowait(Searched([from_hypothesis(h, o.stops, decode, len(stream.prompt))
                                                   for h in stream.search.results]))

    def _drop_cancelled(self) -> None:
        self.waiting = deque(s for s in self.waiting if not s.cancelled)
        self.searches = [s for s in self.searches if not s.cancelled]
        gone = [s for s in self.batch.sequences if s.owner.cancelled]
        if gone:
            self.batch.remove(gone)


async def events_of(stream: Stream) -> AsyncIterator[Any]:
    """The stream's events (Emitted tokens, or a search's Searched) until it finishes; cancelling the consumer
    frees its slot."""
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


async def outcome(stream: Stream) -> list[Generated]:
    """The stream's finished continuations: one for a sampled or greedy decoding, a search's best for beams."""
    final = None
    async for event in events_of(stream):
        final = event
    if isinstance(final, Searched):
        return final.results
    return [generated_of(final.sequence, len(stream.prompt))]


# -- HTTP ---------------------------------------------------------------------------------------------------------
def _sse(payload: Any) -> bytes:
    return b"data: " + (payload if isinstance(payload, bytes) else orjson.dumps(payload)) + b"\n\n"


def _logprobs(chosen: Sequence[TokenLogprob], decode: Any) -> dict[str, Any]:
    """OpenAI's completion ``logprobs`` object for these tokens (text offsets within the continuation)."""
    def piece(token: int) -> str:
        return decode([token])
    return {"tokens": [piece(c.token) for c in chosen], "token_logprobs": [c.logprob for c in chosen],
            "top_logprobs": [{piece(i): lp for i, lp in c.top} for c in chosen],
            "text_offset": [c.offset for c in chosen]}


async def _start(app: FastAPI, served: Any, body: Any) -> tuple[list[Stream], list[int], Any]:
    """The request's streams (per prompt: one, or one per sampled copy), each prompt's token count, and its
    options."""
    config = app.state.config
    prompts = body.prompts()
    if len(prompts) > config.max_inputs_per_request:
        raise HTTPError(413, "too_many_inputs", f"{len(prompts)} prompts in one request; the limit is "
                        f"{config.max_inputs_per_request} (--max-inputs-per-request)")
    predictor: Predictor = served.predictor
    try:
        texts, chat = prompt_texts(predictor.config.chat, prompts)  # a conversation in the model's chat template
        asked = body.options()
        new_tokens = asked["max_new_tokens"] or 1  # none asked (a chat): up to the window, known once tokenized
        options = predictor.handler.options(**{**asked, "max_new_tokens": new_tokens, "special_tokens": not chat})
        if options.beams.active and body.stream:
            raise UsageError("stream: a beam search knows its answer only when it ends; set stream false, or "
                             "num_beams 1 to stream")
        ids = await asyncio.get_running_loop().run_in_executor(
            app.state.pool, lambda: prompt_ids(predictor, texts, new_tokens, special_tokens=not chat))
        if asked["max_new_tokens"] is None:
            room = predictor.encoder.max_length - max(len(i) for i in ids)
            options = replace(options, stops=replace(options.stops, max_new_tokens=room))
    except UsageError as err:
        raise HTTPError(422, "invalid_request", err.message) from err
    loop: DecodeLoop = served.scheduler
    copies = [options] if options.beams.active else \
        [replace(options, sampling=s) for s in copies_of(options.sampling, options.num_return_sequences)]
    return [loop.submit(p, o) for p in ids for o in copies], [len(p) for p in ids], options


async def _generate(app: FastAPI, served: Any, body: Any) -> Any:
    (stream,), (prompt_tokens,), _ = await _start(app, served, body)
    if body.stream:
        async def events() -> AsyncIterator[bytes]:
            async for e in events_of(stream):
                text = e.sequence.text
                yield _sse({"token": {"id": e.token, "text": e.text}, "generated_text": text.text if e.finished
                            else None, "finish_reason": text.finish_reason})
        return StreamingResponse(events(), media_type="text/event-stream")
    (best, *_) = await outcome(stream)
    generated = len(best.token_ids)
    return {"model": served.name, "generated_text": best.text, "finish_reason": best.finish_reason,
            "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": generated,
                      "total_tokens": prompt_tokens + generated}}


def _chat_logprobs(chosen: Sequence[TokenLogprob], encoder: Any) -> dict[str, Any]:
    """OpenAI's chat ``logprobs`` object for these tokens: per token its text, its own bytes (a byte-level token may
    hold part of a character: the bytes of a reply's tokens join into its UTF-8) and the best alternatives."""
    def entry(token: int, logprob: float) -> dict[str, Any]:
        return {"token": encoder.decode([token]), "logprob": logprob, "bytes": list(encoder.token_bytes(token))}
    return {"content": [{**entry(c.token, c.logprob), "top_logprobs": [entry(i, lp) for i, lp in c.top]}
                        for c in chosen]}


async def _openai(streams: list[Stream], prompt_tokens: list[int], stream: bool, head: dict[str, Any],
                  choice: Any, piece: Any) -> Any:
    """An OpenAI completions answer (text or chat): ``choice(index, Generated)`` shapes a whole choice,
    ``piece(index, Emitted, first)`` one streamed chunk's choice (``first``: that choice's first chunk)."""
    if stream:
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
                done, started = 0, set()
                while done < len(streams):
                    index, e = await queue.get()
                    if isinstance(e, Exception):
                        yield _sse({"error": {"type": "inference_failed", "message": str(e)}})
                        return
                    done += e.finished
                    yield _sse({**head, "choices": [piece(index, e, index not in started)]})
                    started.add(index)
                yield _sse(b"[DONE]")
            finally:
                for p in pumps:
                    p.cancel()
                for s in streams:
                    s.cancelled = True
        return StreamingResponse(events(), media_type="text/event-stream")
    choices: list[dict[str, Any]] = []
    completion = 0
    try:
        for each in streams:  # OpenAI's order: prompt by prompt, each prompt's n choices together
            for found in await outcome(each):
                completion += len(found.token_ids)
                choices.append(choice(len(choices), found))
    finally:
        for s in streams:
            s.cancelled = True
    total = sum(prompt_tokens)
    return {**head, "choices": choices,
            "usage": {"prompt_tokens": total, "completion_tokens": completion, "total_tokens": total + completion}}


async def _completions(app: FastAPI, served: Any, body: Any) -> Any:
    streams, prompt_tokens, _ = await _start(app, served, body)
    decode = served.predictor.encoder.decode
    head = {"id": f"cmpl-{uuid.uuid4().hex}", "object": "text_completion", "created": int(time.time()),
            "model": served.name}

    def choice(index: int, found: Generated) -> dict[str, Any]:
        logprobs = None if found.logprobs is None else _logprobs(found.logprobs, decode)
        return {"text": found.text, "index": index, "logprobs": logprobs, "finish_reason": found.finish_reason}

    def piece(index: int, e: Emitted, first: bool) -> dict[str, Any]:
        logprobs = None if e.logprob is None else _logprobs([e.logprob], decode)
        return {"text": e.text, "index": index, "logprobs": logprobs, "finish_reason": e.sequence.text.finish_reason}

    return await _openai(streams, prompt_tokens, body.stream, head, choice, piece)


async def _chat_completions(app: FastAPI, served: Any, body: Any) -> Any:
    streams, prompt_tokens, _ = await _start(app, served, body)
    encoder = served.predictor.encoder
    head = {"id": f"chatcmpl-{uuid.uuid4().hex}", "object": "chat.completion.chunk" if body.stream else
            "chat.completion", "created": int(time.time()), "model": served.name}

    def choice(index: int, found: Generated) -> dict[str, Any]:
        logprobs = None if found.logprobs is None else _chat_logprobs(found.logprobs, encoder)
        return {"index": index, "message": {"role": "assistant", "content": found.text}, "logprobs": logprobs,
                "finish_reason": found.finish_reason}

    def piece(index: int, e: Emitted, first: bool) -> dict[str, Any]:
        logprobs = None if e.logprob is None else _chat_logprobs([e.logprob], encoder)
        delta = {"role": "assistant", "content": e.text} if first else {"content": e.text}
        return {"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": e.sequence.text.finish_reason}

    return await _openai(streams, prompt_tokens, body.stream, head, choice, piece)


ANSWERS = {"/generate": _generate, "/v1/completions": _completions, "/v1/chat/completions": _chat_completions}

STREAM_DOC = {200: {"content": {"text/event-stream": {"schema": {"type": "string"}}},
                    "description": "JSON, or with `stream: true` server-sent events (`data: {...}` per piece of "
                                   "text; the OpenAI routes end with `data: [DONE]`)."}}


def mount_route(app: FastAPI, route: Route) -> None:
    """POST ``route.path``: JSON, or server-sent events with ``stream: true``."""
    answer = ANSWERS[route.path.removeprefix(KILN_PREFIX)]  # kiln's /generate is also served as /kiln/generate

    async def endpoint(body: Any) -> Any:
        # A streamed answer's span ends when streaming starts (the first token is in it; later ones are not).
        with picked(app, body.model, route, stream=body.stream) as (served, _):
            result = await answer(app, served, body)
        return result if isinstance(result, StreamingResponse) else JSONBody(result)

    post_endpoint(app, route, endpoint, {**INFERENCE_ERRORS, **STREAM_DOC})


