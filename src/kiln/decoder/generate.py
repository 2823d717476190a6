"""Offline generation: prompts in, continuations out, on one decoding batch (``Predictor.generate``)."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from kiln.decoder.batch import DecodeBatch, Emitted, new_sequence
from kiln.decoder.sampling import Sampling
from kiln.decoder.steps import Stepper
from kiln.decoder.stopping import Stops
from kiln.errors import UsageError


@dataclass(frozen=True)
class Generated:
    """One prompt's continuation."""

    text: str
    token_ids: tuple[int, ...]
    finish_reason: str  # "length": max_new_tokens reached; "stop": EOS or a stop string
    prompt_tokens: int


@dataclass(frozen=True)
class Budget:
    """How long a prompt may be: the model's window, less the tokens asked for."""

    window: int

    def check(self, prompt_tokens: int, max_new_tokens: int, index: int = 0) -> None:
        if max_new_tokens >= self.window:
            raise UsageError(f"max_new_tokens must be below the model's window of {self.window} tokens "
                             f"(got {max_new_tokens})")
        if prompt_tokens + max_new_tokens > self.window:
            raise UsageError(f"prompt {index} has {prompt_tokens} tokens; with max_new_tokens {max_new_tokens} it "
                             f"passes the model's window of {self.window} tokens")
        if prompt_tokens == 0:
            raise UsageError(f"prompt {index} encodes to no tokens")


def prompt_ids(predictor: Any, prompts: Sequence[str], max_new_tokens: int) -> list[list[int]]:
    """Token ids of each prompt, refused (UsageError) when it and ``max_new_tokens`` would pass the window."""
    prepared = predictor.prepare(prompts, predictor.handler.options(max_new_tokens=max_new_tokens, truncate=False))
    budget = Budget(predictor.encoder.max_length)
    for i, enc in enumerate(prepared.encodings):
        budget.check(len(enc.ids), max_new_tokens, i)
    return [list(enc.ids) for enc in prepared.encodings]


def stream(steps: Stepper, pad_id: int, prompts: Sequence[Sequence[int]], sampling: Sampling, stops: Stops,
           decode, *, batch_size: int = 16) -> Iterator[tuple[int, Emitted]]:
    """(prompt index, what it produced) per step: up to ``batch_size`` prompts decode together and a finished
    one's place goes to the next waiting prompt (the same continuous batching the server does)."""
    if batch_size < 1:
        raise UsageError(f"batch_size must be at least 1 (got {batch_size})")
    batch = DecodeBatch(steps, pad_id)
    waiting = list(enumerate(prompts))
    while waiting or len(batch):
        room = batch_size - len(batch)
        if waiting and room > 0:  # joiners prefill in one call and get their first token; the others wait a round
            joining, waiting = waiting[:room], waiting[room:]
            emitted = batch.add([new_sequence(p, sampling, stops, decode, owner=i) for i, p in joining])
        else:
            emitted = batch.step()
        for e in emitted:
            yield e.sequence.owner, e
        batch.remove([e.sequence for e in emitted if e.finished])


def collect(events: Iterator[tuple[int, Emitted]], prompt_lengths: Sequence[int]) -> list[Generated]:
    """The finished continuations of ``stream``'s events, in prompt order."""
    done: dict[int, Generated] = {}
    for i, e in events:
        if e.finished:
            text = e.sequence.text
            ids = (*text.ids, text.eos) if text.eos is not None else tuple(text.ids)
            done[i] = Generated(text.text, ids, str(text.finish_reason), prompt_lengths[i])
    return [done[i] for i in range(len(prompt_lengths))]
