"""Log-probabilities of the tokens a decoding chose: what OpenAI's ``logprobs`` reports per completion token.

They are the model's own distribution (log-softmax of the raw logits, before the repetition penalty, temperature,
top-k or top-p), as vLLM reports by default, so a client can score text independently of how it was sampled; the
test compares them with transformers' forward pass on the same weights.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

MAX_LOGPROBS = 20  # alternatives per token, as vLLM's default limit


@dataclass(frozen=True)
class TokenLogprob:
    """One chosen token: its log-probability, the ``top`` most likely alternatives (id, log-probability) best first,
    and where its text starts in the continuation (characters)."""

    token: int
    logprob: float
    top: tuple[tuple[int, float], ...]
    offset: int


def log_softmax(logits: np.ndarray) -> np.ndarray:
    shifted = logits.astype(np.float32) - logits.max(axis=-1, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))


def token_logprob(row: np.ndarray, token: int, top: int, offset: int) -> TokenLogprob:
    """``token``'s log-probability under one row of logits [vocab], and the ``top`` best alternatives."""
    scores = log_softmax(row)
    top = min(top, scores.size)
    best = np.argpartition(-scores, top - 1)[:top] if top else np.empty(0, np.int64)
    best = best[np.argsort(-scores[best], kind="stable")]
    return TokenLogprob(token, float(scores[token]), tuple((int(i), float(scores[i])) for i in best), offset)
