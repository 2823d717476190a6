"""Run a predictor over a labelled evaluation set and score it with the task's metric."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from kiln.choices import Aggregation, TaskName
from kiln.runtime import Predictor
from kiln.validation import metrics
from kiln.validation.evalsets import EvalSet

# The figure each task's gate compares (higher is better).
PRIMARY: dict[TaskName, str] = {
    TaskName.FEATURE_EXTRACTION: "spearman",
    TaskName.TEXT_CLASSIFICATION: "accuracy",
    TaskName.TOKEN_CLASSIFICATION: "f1",
    TaskName.QUESTION_ANSWERING: "f1",
}


def _sts(predictor: Predictor, data: EvalSet) -> dict[str, float]:
    left = np.stack(predictor.predict([a for a, _ in data.pairs]))
    right = np.stack(predictor.predict([b for _, b in data.pairs]))
    cos = (left * right).sum(1) / np.linalg.norm(left, axis=1) / np.linalg.norm(right, axis=1)
    return {"spearman": metrics.spearman(cos, data.scores)}


def _classification(predictor: Predictor, data: EvalSet) -> dict[str, float]:
    predicted = [r[0].label for r in predictor.predict(data.texts)]
    id2label = predictor.config.id2label
    gold = [id2label.get(int(g), g) if g.isdigit() else g for g in data.labels]
    return {"accuracy": metrics.accuracy(gold, predicted), **metrics.f1_scores(gold, predicted)}


def _word_tags(predictor: Predictor, data: EvalSet) -> list[list[str]]:
    """Per-word tags: the tag of each word's first sub-token (words joined by single spaces)."""
    texts = [" ".join(tokens) for tokens in data.tokens]
    results = predictor.predict(texts, aggregation=Aggregation.NONE, ignore_labels=())
    out = []
    for tokens, entities in zip(data.tokens, results):
        by_start = {}
        for entity in entities:
            by_start.setdefault(entity.start, entity.label)
        starts = np.cumsum([0] + [len(t) + 1 for t in tokens[:-1]])
        out.append([by_start.get(int(s), "O") for s in starts])
    return out


def _tokens(predictor: Predictor, data: EvalSet) -> dict[str, float]:
    return metrics.entity_f1(data.tags, _word_tags(predictor, data))


def _qa(predictor: Predictor, data: EvalSet) -> dict[str, float]:
    allow_null = any(not a for a in data.answers)
    results = predictor.predict(data.questions, allow_null=allow_null)
    predicted = [r[0].answer if r else "" for r in results]
    return metrics.squad_scores(predicted, data.answers)


EVALUATORS: dict[TaskName, Callable[[Predictor, EvalSet], dict[str, float]]] = {
    TaskName.FEATURE_EXTRACTION: _sts,
    TaskName.TEXT_CLASSIFICATION: _classification,
    TaskName.TOKEN_CLASSIFICATION: _tokens,
    TaskName.QUESTION_ANSWERING: _qa,
}


def evaluate(predictor: Predictor, data: EvalSet) -> dict[str, float]:
    return EVALUATORS[data.task](predictor, data)
