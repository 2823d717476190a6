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
from kiln.decoder.logprobs import log_softmax
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


class BeamSearch:
    """One prompt's beam search, a step at a time (``advance``), so a server can interleave it with its running
    batch. Between steps the beams' cache is plain numpy (reordered to the surviving beams' parents right after each
    step), never a view into a runtime's memory, so other work may run on the same stepper in between."""

    def __init__(self, steps: Stepper, prompt: Sequence[int], beams: Beams, max_new_tokens: int,
                 eos_ids: frozenset[int], repetition_penalty: float = 1.0, owner: object = None) -> None:
        self.steps, self.prompt, self.beams = steps, list(prompt), beams
        self.max_new_tokens, self.eos_ids, self.repetition_penalty = max_new_tokens, eos_ids, repetition_penalty
        self.owner = owner  # whoever waits for the result (serving: the request's stream)
        self.width = beams.num_beams
        self.keep = max(2, 1 + len(eos_ids)) * self.width  # candidates per step: enough that width can run on
        self.running: list[list[int]] = [[] for _ in range(self.width)]
        self.scores = np.full(self.width, NEVER, dtype=np.float32)
        self.scores[0] = 0.0  # one live beam at first: the others would repeat it
        self.kept: list[Hypothesis] = []
        self.generated = 0
        self.done = False
        self._improvable = True
        self._past: Past | None = None

    @property
    def results(self) -> list[Hypothesis]:
        """The ``num_return_sequences`` best finished hypotheses, best first."""
        return self.kept[: self.beams.num_return_sequences]

    def advance(self) -> bool:
        """Run one step (the prompt's prefill first) and choose the beams; True once the search has ended."""
        rows = self._prefill() if self._past is None else self._step()
        self.generated += 1
        generated, beams = self.generated, self.beams
        last = generated == self.max_new_tokens
        seen = [self.prompt + r for r in self.running] if self.repetition_penalty != 1.0 else []
        log_probs = penalize_repetition(log_softmax(rows), seen, self.repetition_penalty)
        total = (log_probs + self.scores[:, None]).reshape(-1)
        order = np.argsort(-total, kind="stable")[: self.keep]
        vocab = log_probs.shape[1]
        parents, tokens, totals = order // vocab, order % vocab, total[order]
        stops = np.array([last or int(t) in self.eos_ids for t in tokens])
        # Finished: stopping candidates ranked within the first num_beams, unless the kept slots are closed.
        closed = (len(self.kept) == self.width and beams.early_stopping is True) or not self._improvable
        if not closed:
            normalised = totals / (generated ** beams.length_penalty)
            fresh = [Hypothesis((*self.running[p], int(t)), float(s)) for p, t, s, stop, rank in
                     zip(parents, tokens, normalised, stops, range(len(order))) if stop and rank < self.width]
            self.kept = sorted(self.kept + fresh, key=lambda h: -h.score)[: self.width]
        # Running on: the best candidates that do not stop.
        runnable = totals + stops * NEVER
        live = np.argsort(-runnable, kind="stable")[: self.width]
        self.running = [[*self.running[parents[i]], int(tokens[i])] for i in live]
        self.scores = runnable[live].astype(np.float32)
        if beams.early_stopping == "never" and beams.length_penalty > 0:
            best_length = self.max_new_tokens
        else:
            best_length = generated
        self._improvable = self._improvable and (
            len(self.kept) < self.width
            or self.scores[0] / (best_length ** beams.length_penalty) > min(h.score for h in self.kept))
        full = len(self.kept) == self.width and beams.early_stopping is True
        self.done = not self._improvable or full or bool(stops.all())
        if not self.done:  # the cache follows the surviving beams' parents (a copy: no runtime memory is held)
            arrays = self._past.arrays()
            self._past = Past({n: np.ascontiguousarray(a[parents[live]]) for n, a in arrays.items()},
                              self._past.length)
        else:
            self._past = Past({}, 0)
        return self.done

    def _prefill(self) -> np.ndarray:
        """The prompt is prefilled once; every beam starts from its cache."""
        ids = np.asarray([self.prompt], dtype=np.int64)
        mask = np.ones_like(ids)
        logits, past = self.steps.step(ids, mask, positions(mask, ids.shape[1]), empty_past(self.steps.shape, 1),
                                       last=True)
        self._past = Past({n: np.repeat(a, self.width, axis=0) for n, a in past.arrays().items()}, past.length)
        return np.repeat(logits[:, -1], self.width, axis=0)

    def _step(self) -> np.ndarray:
        mask = np.ones((self.width, self._past.length + 1), dtype=np.int64)
        last_tokens = np.asarray([[r[-1]] for r in self.running], dtype=np.int64)
        logits, self._past = self.steps.step(last_tokens, mask, positions(mask, 1), self._past)
        return logits[:, -1]


def beam_search(steps: Stepper, prompt: Sequence[int], beams: Beams, max_new_tokens: int,
                eos_ids: frozenset[int], repetition_penalty: float = 1.0) -> list[Hypothesis]:
    """The ``num_return_sequences`` best continuations of ``prompt``, best first."""
    search = BeamSearch(steps, prompt, beams, max_new_tokens, eos_ids, repetition_penalty)
    while not search.advance():
        pass
    return search.results
