"""The running batch of a generation: its sequences, their attention mask and KV cache, one step at a time.

Rows are left-padded to a common length, so every step appends one column for all of them. Sequences join
(prefilled together, then padded on the left to the batch's length, or the batch to theirs) and leave
(their rows dropped, then columns no row uses any more trimmed) between steps: continuous batching. Each
composition change brings the cache out of the runtime once; steps in between hand it over untouched.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from kiln.decoder.graph import CacheShape, positions
from kiln.decoder.logprobs import TokenLogprob, token_logprob
from kiln.decoder.sampling import Sampling, next_token
from kiln.decoder.steps import Past, Stepper, empty_past
from kiln.decoder.stopping import Detokenizer, Stops


@dataclass
class Decoding:
    """One prompt being continued: its settings, random state and text so far."""

    prompt: list[int]
    sampling: Sampling
    text: Detokenizer
    rng: np.random.Generator
    owner: Any = None  # whoever waits for it (offline: the prompt's index; serving: the request's stream)
    logprobs: int | None = None  # None: not reported; n: each chosen token's log-probability and the n best
    chosen: list[TokenLogprob] = field(default_factory=list)  # filled when ``logprobs`` is not None

    @property
    def finished(self) -> bool:
        return self.text.finish_reason is not None


def new_sequence(prompt: Sequence[int], sampling: Sampling, stops: Stops, decode: Callable[[Sequence[int]], str],
                 owner: Any = None, logprobs: int | None = None) -> Decoding:
    return Decoding(list(prompt), sampling, Detokenizer(decode, stops), sampling.generator(), owner, logprobs)


@dataclass(frozen=True)
class Emitted:
    """What one step produced for one sequence."""

    sequence: Decoding
    token: int
    text: str  # newly shown text (may be empty)
    finished: bool
    logprob: TokenLogprob | None = None  # when the sequence asked for log-probabilities


class DecodeBatch:
    def __init__(self, steps: Stepper, pad_id: int) -> None:
        self.steps, self.pad_id = steps, pad_id
        self.shape: CacheShape = steps.shape
        self.sequences: list[Decoding] = []
        self.mask = np.zeros((0, 0), np.int64)
        self.past: Past = empty_past(self.shape, 0)
        self.last = np.zeros((0, 1), np.int64)  # each row's latest token, the next step's input

    def __len__(self) -> int:
        return len(self.sequences)

    @property
    def width(self) -> int:
        """Columns of the cache (the longest row, padding included)."""
        return self.mask.shape[1]

    def add(self, sequences: list[Decoding]) -> list[Emitted]:
        """Prefill ``sequences`` (one left-padded call) and take them into the batch; returns their first tokens."""
        width = max(len(s.prompt) for s in sequences)
        ids = np.full((len(sequences), width), self.pad_id, np.int64)
        mask = np.zeros((len(sequences), width), np.int64)
        for i, s in enumerate(sequences):
            ids[i, width - len(s.prompt):] = s.prompt
            mask[i, width - len(s.prompt):] = 1
        logits, past = self.steps.step(ids, mask, positions(mask, width), empty_past(self.shape, len(sequences)),
                                       last=True)
        emitted = self._choose(sequences, logits[:, -1])
        self._merge(sequences, mask, past, np.array([[e.token] for e in emitted], np.int64))
        return emitted

    def step(self) -> list[Emitted]:
        """One token for every sequence in the batch."""
        self.mask = np.concatenate([self.mask, np.ones((len(self), 1), np.int64)], axis=1)
        logits, self.past = self.steps.step(self.last, self.mask, positions(self.mask, 1), self.past)
        emitted = self._choose(self.sequences, logits[:, -1])
        self.last = np.array([[e.token] for e in emitted], np.int64)
        return emitted

    def remove(self, leaving: Sequence[Decoding]) -> None:
        """Drop finished or abandoned sequences, and the left columns only they used."""
        gone = {id(s) for s in leaving}
        keep = [i for i, s in enumerate(self.sequences) if id(s) not in gone]
        if len(keep) == len(self.sequences):
            return
        arrays = self.past.arrays()
        mask = self.mask[keep]
        used = np.flatnonzero(mask.any(axis=0))
        start = int(used[0]) if used.size else mask.shape[1]
        self.sequences = [self.sequences[i] for i in keep]
        self.mask = np.ascontiguousarray(mask[:, start:])
        self.last = self.last[keep]
        self.past = Past({n: np.ascontiguousarray(a[keep][:, :, start:]) for n, a in arrays.items()},
                         self.mask.shape[1])

    def _choose(self, sequences: Sequence[Decoding], logits: np.ndarray) -> list[Emitted]:
        out = []
        for seq, row in zip(sequences, logits):
            token = next_token(row, seq.sampling, seq.rng, seq.prompt + seq.text.ids
                               if seq.sampling.repetition_penalty != 1.0 else ())
            logprob = None
            if seq.logprobs is not None:
                logprob = token_logprob(row, token, seq.logprobs, len(seq.text.text))
                seq.chosen.append(logprob)
            text = seq.text.add(token)
            out.append(Emitted(seq, token, text, seq.finished, logprob))
        return out

    def _merge(self, sequences: list[Decoding], mask: np.ndarray, past: Past, last: np.ndarray) -> None:
        if not self.sequences:
            self.sequences, self.mask, self.past, self.last = list(sequences), mask, past, last
            return
        width = max(self.width, mask.shape[1])
        mine, theirs = self.past.arrays(), past.arrays()
        self.past = Past({n: np.concatenate([_pad_left(mine[n], width), _pad_left(theirs[n], width)])
                          for n in mine}, width)
        self.mask = np.concatenate([_pad_left(self.mask, width, axis=1), _pad_left(mask, width, axis=1)])
        self.last = np.concatenate([self.last, last])
        self.sequences += sequences


def _pad_left(array: np.ndarray, width: int, axis: int = 2) -> np.ndarray:
    missing = width - array.shape[axis]
    if missing == 0:
        return array
    pad = [(0, 0)] * array.ndim
    pad[axis] = (missing, 0)
    return np.pad(array, pad)
