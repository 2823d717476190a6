"""Sequence classification: softmax (or sigmoid for multi-label), id2label, top-k."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from kiln.choices import TaskName
from kiln.errors import UsageError
from kiln.taskconfig import TaskConfig
from kiln.tasks.base import Prepared, one_per_input, sigmoid, softmax
from kiln.tokenization import TextEncoder


@dataclass(frozen=True)
class LabelScore:
    label: str
    score: float


@dataclass(frozen=True)
class ClassifyOptions:
    top_k: int | None = 1  # None: every label
    truncate: bool = True


def score_function(config: TaskConfig, num_labels: int):
    """The transformers pipeline's default: identity for regression, sigmoid for multi-label, else softmax."""
    if config.problem_type == "regression":
        return lambda x: x
    if config.problem_type == "multi_label_classification" or num_labels == 1:
        return sigmoid
    return softmax


class TextClassification:
    name = TaskName.TEXT_CLASSIFICATION
    output_names = ("logits",)

    def __init__(self, config: TaskConfig) -> None:
        self._config = config

    def options(self, top_k: int | None = 1, truncate: bool = True) -> ClassifyOptions:
        if top_k is not None and top_k < 1:
            raise UsageError(f"top_k must be at least 1, or None for every label (got {top_k})")
        return ClassifyOptions(top_k=top_k, truncate=truncate)

    def prepare(self, inputs: Sequence[str], encoder: TextEncoder, options: ClassifyOptions) -> Prepared:
        return one_per_input(inputs, encoder.encode(inputs, truncate=options.truncate))

    def reduce(self, outputs: dict[str, np.ndarray], attention_mask: np.ndarray) -> list[np.ndarray]:
        return list(outputs["logits"].astype(np.float32))

    def finalize(
        self, prepared: Prepared, reduced: list[Any], options: ClassifyOptions, encoder: TextEncoder,
        config: TaskConfig,
    ) -> list[list[LabelScore]]:
        results = []
        for logits in reduced:
            scores = score_function(config, logits.shape[-1])(logits)
            order = np.argsort(-scores, kind="stable")[: options.top_k]
            results.append([LabelScore(config.id2label.get(int(i), f"LABEL_{i}"), float(scores[i])) for i in order])
        return results

    def comparable(self, reduced: np.ndarray) -> np.ndarray:
        return reduced
