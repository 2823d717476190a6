"""Choosing the next token: greedy, or sampling with temperature, top-k and top-p, after the repetition penalty
(in transformers' order)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from kiln.errors import UsageError


@dataclass(frozen=True)
class Sampling:
    """temperature 0 is greedy (argmax); otherwise logits / temperature, then top-k, then top-p, then a draw."""

    temperature: float = 0.0
    top_k: int | None = None
    top_p: float = 1.0
    seed: int | None = None  # same seed, prompt and model: the same tokens
    repetition_penalty: float = 1.0  # transformers' RepetitionPenaltyLogitsProcessor (1: none)

    def __post_init__(self) -> None:
        if not 0 <= self.temperature <= 100:
            raise UsageError(f"temperature must be between 0 and 100 (got {self.temperature:g})")
        if self.top_k is not None and self.top_k < 1:
            raise UsageError(f"top_k must be at least 1 (got {self.top_k})")
        if not 0 < self.top_p <= 1:
            raise UsageError(f"top_p must be above 0 and at most 1 (got {self.top_p:g})")
        if not 0 < self.repetition_penalty <= 100:
            raise UsageError(f"repetition_penalty must be above 0 and at most 100 (got {self.repetition_penalty:g})")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    def generator(self) -> np.random.Generator:
        return np.random.default_rng(self.seed)


def penalize_repetition(scores: np.ndarray, seen: Sequence[Sequence[int]], penalty: float) -> np.ndarray:
    """transformers' RepetitionPenaltyLogitsProcessor on each row: a token already in the row's sequence (prompt
    included) has its score divided by ``penalty`` when positive, multiplied when negative."""
    if penalty == 1.0:
        return scores
    scores = scores.copy()
    for row, tokens in zip(scores, seen):
        ids = np.unique(np.asarray(tokens, dtype=np.int64))
        row[ids] = np.where(row[ids] < 0, row[ids] * penalty, row[ids] / penalty)
    return scores


def next_token(logits: np.ndarray, sampling: Sampling, rng: np.random.Generator, seen: Sequence[int] = ()) -> int:
    """One token id from one row of logits [vocab]; ``seen``: the sequence so far (prompt and generated tokens),
    which the repetition penalty reads."""
    if sampling.repetition_penalty != 1.0:
        logits = penalize_repetition(logits[None], [seen], sampling.repetition_penalty)[0]
    if sampling.greedy:
        return int(np.argmax(logits))
    scores = logits.astype(np.float64) / sampling.temperature
    if sampling.top_k is not None and sampling.top_k < scores.size:
        kth = np.partition(scores, -sampling.top_k)[-sampling.top_k]
        scores = np.where(scores < kth, -np.inf, scores)
    probs = np.exp(scores - scores.max())
    probs /= probs.sum()
    if sampling.top_p < 1:
        # Keep the most likely tokens whose mass reaches top_p (at least one), as transformers' TopPLogitsWarper.
        order = np.argsort(-probs, kind="stable")
        before = np.cumsum(probs[order]) - probs[order]
        drop = order[before >= sampling.top_p]
        probs[drop] = 0
        probs /= probs.sum()
    return int(rng.choice(probs.size, p=probs))
