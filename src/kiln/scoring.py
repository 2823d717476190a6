"""How outputs are scored: the cosine between two output vectors, and the task metrics kiln computes itself
(SQuAD EM/F1 by the official script's rules, Spearman via scipy, NDCG, Kendall's tau). Pure functions of numbers, at
the bottom of the layers, so tasks and validation share them.

Entity F1 comes from seqeval and classification scores from scikit-learn, in the task modules; the SQuAD
scorer is kept here because the `evaluate` library fetches its metric scripts from the hub at run time.
"""

from __future__ import annotations

import math
import re
import string
from collections import Counter
from collections.abc import Sequence
from statistics import NormalDist

import numpy as np

from kiln.errors import UsageError

_PUNCTUATION = set(string.punctuation)


def normalize_answer(text: str) -> str:
    """SQuAD's normalization: lower case, no punctuation, no articles, single spaces."""
    text = "".join(ch for ch in text.lower() if ch not in _PUNCTUATION)
    text = re.sub(r"\b(a|an|the)\b", " ", text)
    return " ".join(text.split())


def _token_f1(prediction: str, truth: str) -> float:
    pred_tokens, true_tokens = normalize_answer(prediction).split(), normalize_answer(truth).split()
    if not pred_tokens or not true_tokens:
        return float(pred_tokens == true_tokens)
    common = sum((Counter(pred_tokens) & Counter(true_tokens)).values())
    if not common:
        return 0.0
    precision, recall = common / len(pred_tokens), common / len(true_tokens)
    return 2 * precision * recall / (precision + recall)


def squad_scores(predictions: Sequence[str], answers: Sequence[Sequence[str]]) -> dict[str, float]:
    """Exact match and F1 as fractions (SQuAD prints them x100), best over the gold answers.

    As the official v2.0 script: gold answers that normalise to "" are dropped, and a question left with
    none has the empty answer as its only right answer.
    """
    em, f1 = [], []
    for prediction, golds in zip(predictions, answers):
        golds = [g for g in golds if normalize_answer(g)] or [""]
        em.append(max(float(normalize_answer(prediction) == normalize_answer(g)) for g in golds))
        f1.append(max(_token_f1(prediction, g) for g in golds))
    return {"exact_match": float(np.mean(em)), "f1": float(np.mean(f1))}


def spearman(x: Sequence[float], y: Sequence[float]) -> float:
    """Spearman's rank correlation (scipy), 0.0 where either side is constant (scipy says nan)."""
    from scipy.stats import spearmanr

    rx, ry = np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64)
    if rx.std() == 0 or ry.std() == 0:
        return 0.0
    return float(spearmanr(rx, ry).statistic)


def ranking(scores: Sequence[float]) -> list[int]:
    """Indices from the highest score to the lowest (ties keep input order)."""
    return [int(i) for i in np.argsort(-np.asarray(scores, dtype=np.float64), kind="stable")]


def ndcg_at_k(scores: Sequence[float], relevance: Sequence[float], k: int = 10) -> float:
    """NDCG@k with graded gains ``2**rel - 1`` (the TREC/BEIR definition); 0 when nothing is relevant."""
    return ndcg_of_ranking(ranking(scores), relevance, k)


def ndcg_of_ranking(ranked: Sequence[int], relevance: Sequence[float], k: int = 10) -> float:
    """NDCG@k of item indices ranked best first (as :func:`ndcg_at_k`, from a search's results)."""
    gains = np.power(2.0, np.asarray(relevance, dtype=np.float64)) - 1.0
    discounts = 1.0 / np.log2(np.arange(2, k + 2))
    found = gains[np.asarray(ranked, dtype=np.int64)[:k]]
    ideal = np.sort(gains)[::-1][:k]
    best = float((ideal * discounts[: len(ideal)]).sum())
    return float((found * discounts[: len(found)]).sum()) / best if best > 0 else 0.0


def reciprocal_rank(scores: Sequence[float], relevance: Sequence[float]) -> float:
    """1 / the rank of the first relevant (relevance > 0) text; 0 when none is."""
    relevant = np.asarray(relevance, dtype=np.float64) > 0
    return next((1.0 / (rank + 1) for rank, i in enumerate(ranking(scores)) if relevant[i]), 0.0)


def kendall_tau(a: Sequence[float], b: Sequence[float]) -> float:
    """Kendall's tau-b between two score lists (1: the same order); 1 for fewer than two items or no variance."""
    from scipy.stats import kendalltau

    if len(a) < 2:
        return 1.0
    tau = kendalltau(a, b).statistic
    return 1.0 if np.isnan(tau) else float(tau)


def cosine(a: np.ndarray, b: np.ndarray) -> float:
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    denom = np.linalg.norm(a64) * np.linalg.norm(b64)
    return float(a64 @ b64 / denom) if denom > 0 else float(np.array_equal(a64, b64))


def tolerance_factor(count: int, share: float, confidence: float) -> float:
    """One-sided normal tolerance factor k: with ``confidence``, at least ``share`` of a normal population lies
    below mean + k * sd of a sample of ``count`` (Natrella's approximation; within 1% of the exact noncentral-t
    factor from 8 samples up: 5.635 against 5.688 at 8, 3.477 against 3.481 at 128, for 99.9% at 95%)."""
    if count < 3:
        raise UsageError(f"count must be at least 3 for a tolerance bound (got {count})")
    z_share, z_conf = NormalDist().inv_cdf(share), NormalDist().inv_cdf(confidence)
    a = 1 - z_conf**2 / (2 * (count - 1))
    b = z_share**2 - z_conf**2 / count
    return (z_share + math.sqrt(z_share**2 - a * b)) / a


def cosine_bound(cosines: np.ndarray, share: float = 0.999, confidence: float = 0.95) -> float:
    """The cosine that, with ``confidence``, at least ``share`` of inputs like ``cosines``' reach, if each input's
    deficit (1 - cosine) is log-normal: a one-sided normal tolerance bound on the deficits' logarithm.

    A minimum says nothing about the next input; this bound widens with the spread of the ones seen. The model is an
    approximation: dynamic int8's per-batch scales give some kinds of text heavier tails (benchmarks/unseen_text.py:
    on licence text with 0.29% of texts below 0.99, 49% of 160-text samples still passed), so kiln holds it as a
    margin, and states as a promise only what needs no model."""
    values = np.asarray(cosines, dtype=np.float64)
    logs = np.log(np.clip(1.0 - values, 1e-12, None))  # identical outputs: a deficit of 0, not -inf
    reach = 1.0 - math.exp(min(logs.mean() + tolerance_factor(len(values), share, confidence) * logs.std(ddof=1),
                               math.log(2.0)))  # a deficit of 2 is the opposite vector: the bound's floor is -1
    return float(reach)


def stacked(documents: Sequence[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """Documents' token vectors as one [all tokens, dim] array, and where each document starts in it."""
    lengths = np.array([len(d) for d in documents])
    if (lengths == 0).any():
        raise UsageError("a document with no token vectors cannot be scored (every token was skipped)")
    return np.concatenate(documents), np.concatenate([[0], np.cumsum(lengths)[:-1]])


def maxsim_stacked(query: np.ndarray, tokens: np.ndarray, starts: np.ndarray) -> np.ndarray:
    """MaxSim of one query against stacked documents (:func:`stacked`): one matrix product, a segmented max."""
    sims = tokens @ query.T  # [all document tokens, query tokens]
    return np.maximum.reduceat(sims, starts, axis=0).sum(axis=1).astype(np.float32)


def maxsim(query: np.ndarray, documents: Sequence[np.ndarray]) -> np.ndarray:
    """ColBERT's late-interaction score of one query against each document: the sum over the query's vectors of
    their best dot product with any of the document's vectors."""
    if not documents:
        return np.zeros(0, dtype=np.float32)
    return maxsim_stacked(query, *stacked(documents))


def greedy_figures(kept: Sequence[int], lengths: Sequence[int], identical: Sequence[bool]) -> dict[str, float]:
    """A decoder's greedy-text figures from, per prompt, how many of the original's ``lengths`` tokens were kept
    before the first difference and whether the whole continuation was: the share of the original's tokens kept
    (``greedy_agreement``, what the gate holds a decoder variant and a served decoder to), the share of prompts
    continued identically, and how many tokens the original wrote."""
    total = sum(lengths)
    return {"greedy_agreement": sum(kept) / total if total else 1.0,
            "greedy_identical": sum(identical) / max(len(lengths), 1), "greedy_tokens": float(total)}
