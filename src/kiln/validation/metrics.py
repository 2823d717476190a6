"""Task metrics, written out so their definitions are visible: accuracy/F1, SQuAD EM/F1, seqeval F1, Spearman."""

from __future__ import annotations

import re
import string
from collections import Counter
from collections.abc import Sequence

import numpy as np


def accuracy(gold: Sequence[object], pred: Sequence[object]) -> float:
    return float(np.mean([g == p for g, p in zip(gold, pred)])) if gold else 0.0


def f1_scores(gold: Sequence[str], pred: Sequence[str]) -> dict[str, float]:
    """Binary F1 (positive = the second label in sorted order) for two labels, macro F1 always."""
    labels = sorted(set(gold) | set(pred))
    per_label = {}
    for label in labels:
        tp = sum(g == label and p == label for g, p in zip(gold, pred))
        fp = sum(g != label and p == label for g, p in zip(gold, pred))
        fn = sum(g == label and p != label for g, p in zip(gold, pred))
        per_label[label] = 2 * tp / (2 * tp + fp + fn) if tp else 0.0
    gold_labels = sorted(set(gold))
    scores = {"f1_macro": float(np.mean([per_label[label] for label in gold_labels])) if gold_labels else 0.0}
    if len(gold_labels) == 2:
        scores["f1_binary"] = per_label[gold_labels[1]]
    return scores


def _normalize_answer(text: str) -> str:
    """SQuAD's normalization: lower case, no punctuation, no articles, single spaces."""
    text = "".join(ch for ch in text.lower() if ch not in set(string.punctuation))
    text = re.sub(r"\b(a|an|the)\b", " ", text)
    return " ".join(text.split())


def _token_f1(prediction: str, truth: str) -> float:
    pred_tokens, true_tokens = _normalize_answer(prediction).split(), _normalize_answer(truth).split()
    if not pred_tokens or not true_tokens:
        return float(pred_tokens == true_tokens)
    common = sum((Counter(pred_tokens) & Counter(true_tokens)).values())
    if not common:
        return 0.0
    precision, recall = common / len(pred_tokens), common / len(true_tokens)
    return 2 * precision * recall / (precision + recall)


def squad_scores(predictions: Sequence[str], answers: Sequence[Sequence[str]]) -> dict[str, float]:
    """Exact match and F1 as fractions (SQuAD prints them x100), best over the gold answers.

    An empty list of gold answers means the question has none, so "" is the right answer (SQuAD 2.0).
    """
    em, f1 = [], []
    for prediction, golds in zip(predictions, answers):
        golds = list(golds) or [""]
        em.append(max(float(_normalize_answer(prediction) == _normalize_answer(g)) for g in golds))
        f1.append(max(_token_f1(prediction, g) for g in golds))
    return {"exact_match": float(np.mean(em)), "f1": float(np.mean(f1))}


def _spans(tags: Sequence[str]) -> set[tuple[str, int, int]]:
    """Entities of an IOB2 sequence as (type, start, end); an I- without a matching opener starts one."""
    spans, kind, start = set(), None, 0
    for i, tag in enumerate([*tags, "O"]):
        prefix, _, label = tag.partition("-") if "-" in tag else (tag, "", "")
        if kind is not None and (prefix != "I" or label != kind):
            spans.add((kind, start, i))
            kind = None
        if prefix in ("B", "I") and kind is None:
            kind, start = label, i
    return spans


def entity_f1(gold: Sequence[Sequence[str]], pred: Sequence[Sequence[str]]) -> dict[str, float]:
    """Entity-level precision/recall/F1 over IOB2 tag sequences, as seqeval computes them."""
    true = {(i, *s) for i, tags in enumerate(gold) for s in _spans(tags)}
    found = {(i, *s) for i, tags in enumerate(pred) for s in _spans(tags)}
    tp = len(true & found)
    precision = tp / len(found) if found else 0.0
    recall = tp / len(true) if true else 0.0
    f1 = 2 * precision * recall / (precision + recall) if tp else 0.0
    return {"precision": precision, "recall": recall, "f1": f1}


def _ranks(values: np.ndarray) -> np.ndarray:
    """Ranks with ties averaged (as scipy.stats.rankdata)."""
    order = np.argsort(values, kind="mergesort")
    ranks = np.empty(len(values), dtype=np.float64)
    sorted_values = values[order]
    i = 0
    while i < len(values):
        j = i
        while j + 1 < len(values) and sorted_values[j + 1] == sorted_values[i]:
            j += 1
        ranks[order[i : j + 1]] = (i + j) / 2 + 1
        i = j + 1
    return ranks


def spearman(x: Sequence[float], y: Sequence[float]) -> float:
    rx, ry = _ranks(np.asarray(x, dtype=np.float64)), _ranks(np.asarray(y, dtype=np.float64))
    if rx.std() == 0 or ry.std() == 0:
        return 0.0
    return float(np.corrcoef(rx, ry)[0, 1])
