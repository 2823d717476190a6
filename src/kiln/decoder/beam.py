"""Beam search on the step graph: ``num_beams`` continuations of one prompt decode as one batch, and the
``num_return_sequences`` best finished ones are returned, token for token what transformers' ``generate`` returns
(its ``_beam_search`` since 4.50, read for this; the test holds kiln to it on the same weights).

Per step, for a prompt with ``num_beams`` running beams:
1. each beam's next-token log-probabilities (log-softmax, then the repetition penalty on them, as transformers
   applies its processors in beam search) are added to the beam's running score;
2. the best ``(1 + EOS ids) x num_beams`` (at least 2 x) of all beams' continuations are candidates;
3. the best ``num_beams`` candidates that do not stop (EOS, or the last token allowed) run on; the cache rows are
   reordered to their parents';
4. a candidate that stops, ranked within the first ``num_beams``, is a finished hypothesis scored by its sum of
   log-probabilities over (generated length ** length_penalty); the ``num_beams`` best are kept;
5. the search ends when no continuation can run, when every kept slot is filled and ``early_stopping`` is True, or
   when the best running beam cannot beat the worst kept one (scored at its current length; with
   ``early_stopping="never"`` and a positive length penalty, at the longest it could reach).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from kiln.decoder.graph import positions
from kiln.decoder.sampling import penalize_repetition
from kiln.decoder.steps import Past, Stepper, empty_past
from kiln.errors import UsageError

MAX_BEAMS = 16  # each beam is a row of the step batch: past this, a request costs as much as a full batch
EARLY_STOPPING = (True, False, "never")
NEVER = -1.0e9  # transformers' score for a candidate that may not be picked


@dataclass(frozen=True)
class Beams:
    """Beam search settings, named and defaulted as transformers' GenerationConfig names them."""

    num_beams: int = 1
    length_penalty: float = 1.0
    early_stopping: bool | str = False
    num_return_sequences: int = 1

    def __post_init__(self) -> None:
        if not 1 <= self.num_beams <= MAX_BEAMS:
            raise UsageError(f"num_beams must be between 1 and {MAX_BEAMS} (got {self.num_beams})")
        if not 1 <= self.num_return_sequences <= self.num_beams:
            raise UsageError(f"num_return_sequences must be between 1 and num_beams ({self.num_beams}) with beam "
                             f"search (got {self.num_return_sequences})")
        if self.early_stopping not in EARLY_STOPPING or isinstance(self.early_stopping, int) and \
                not isinstance(self.early_stopping, bool):
            raise UsageError(f"early_stopping must be true, false or \"never\" (got {self.early_stopping!r})")
        if not -10 <= self.length_penalty <= 10:
            raise UsageError(f"length_penalty must be between -10 and 10 (got {self.length_penalty:g})")

    @property
    def active(self) -> bool:
        return self.num_beams > 1


@dataclass(frozen=True)
class Hypothesis:
    """One finished beam: its generated tokens (an EOS it stopped at included) and its length-normalised score."""

    tokens: tuple[int, ...]
    score: float


def log_softmax(logits: np.ndarray) -> np.ndarray:
    shifted = logits.astype(np.float32) - logits.max(axis=-1, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))


def beam_search(steps: Stepper, prompt: Sequence[int], beams: Beams, max_new_tokens: int,
                eos_ids: frozenset[int], repetition_penalty: float = 1.0) -> list[Hypothesis]:
    """The ``num_return_sequences`` best continuations of ``prompt``, best first."""
    width = beams.num_beams
    keep = max(2, 1 + len(eos_ids)) * width  # candidates per step: enough that width of them can run on
    ids = np.asarray([prompt], dtype=np.int64)
    mask = np.ones_like(ids)
    logits, past = steps.step(ids, mask, positions(mask, ids.shape[1]), empty_past(steps.shape, 1))
    # The prompt is prefilled once; every beam starts from its cache.
    past = Past({n: np.repeat(a, width, axis=0) for n, a in past.arrays().items()}, past.length)
    rows = np.repeat(logits[:, -1], width, axis=0)
    running: list[list[int]] = [[] for _ in range(width)]
    scores = np.full(width, NEVER, dtype=np.float32)
    scores[0] = 0.0  # one live beam at first: the others would repeat it
    kept: list[Hypothesis] = []
    improvable = True
    for step in range(max_new_tokens):
        generated = step + 1
        last = generated == max_new_tokens
        seen = [list(prompt) + r for r in running] if repetition_penalty != 1.0 else []
        log_probs = penalize_repetition(log_softmax(rows), seen, repetition_penalty)
        total = (log_probs + scores[:, None]).reshape(-1)
        order = np.argsort(-total, kind="stable")[:keep]
        vocab = log_probs.shape[1]
        parents, tokens, totals = order // vocab, order % vocab, total[order]
        stops = np.array([last or int(t) in eos_ids for t in tokens])
        # Finished: stopping candidates ranked within the first num_beams, unless the kept slots are closed.
        closed = (len(kept) == width and beams.early_stopping is True) or not improvable
        if not closed:
            normalised = totals / (generated ** beams.length_penalty)
            fresh = [Hypothesis((*running[p], int(t)), float(s)) for p, t, s, stop, rank in
                     zip(parents, tokens, normalised, stops, range(len(order))) if stop and rank < width]
            kept = sorted(kept + fresh, key=lambda h: -h.score)[:width]
        # Running on: the best candidates that do not stop.
        runnable = totals + stops * NEVER
        live = np.argsort(-runnable, kind="stable")[:width]
        running = [[*running[parents[i]], int(tokens[i])] for i in live]
        scores = runnable[live].astype(np.float32)
        if beams.early_stopping == "never" and beams.length_penalty > 0:
            best_length = max_new_tokens
        else:
            best_length = generated
        improvable = improvable and (len(kept) < width or
                                     scores[0] / (best_length ** beams.length_penalty) > min(h.score for h in kept))
        if not improvable or (len(kept) == width and beams.early_stopping is True) or stops.all():
            break
        arrays = past.arrays()
        past = Past({n: np.ascontiguousarray(a[parents[live]]) for n, a in arrays.items()}, past.length)
        mask = np.ones((width, past.length + 1), dtype=np.int64)
        last_tokens = np.asarray([[r[-1]] for r in running], dtype=np.int64)
        logits, past = steps.step(last_tokens, mask, positions(mask, 1), past)
        rows = logits[:, -1]
    return kept[: beams.num_return_sequences]
