"""Sentence embeddings: pooling and normalization as the model's sentence-transformers config says."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from kiln.choices import Pooling, TaskName
from kiln.taskconfig import TaskConfig
from kiln.tasks.base import Prepared, one_per_input
from kiln.tokenization import TextEncoder


@dataclass(frozen=True)
class EmbedOptions:
    truncate: bool = True


def _pool_mean(hidden: np.ndarray, mask: np.ndarray) -> np.ndarray:
    weights = mask[..., None].astype(hidden.dtype)
    return (hidden * weights).sum(axis=1) / np.clip(weights.sum(axis=1), 1e-9, None)


def _pool_cls(hidden: np.ndarray, mask: np.ndarray) -> np.ndarray:
    return hidden[:, 0]


def _pool_max(hidden: np.ndarray, mask: np.ndarray) -> np.ndarray:
    return np.where(mask[..., None].astype(bool), hidden, -np.inf).max(axis=1)


POOLERS = {Pooling.MEAN: _pool_mean, Pooling.CLS: _pool_cls, Pooling.MAX: _pool_max}


class FeatureExtraction:
    name = TaskName.FEATURE_EXTRACTION
    output_names = ("last_hidden_state",)

    def __init__(self, config: TaskConfig) -> None:
        self._pool = POOLERS[config.pooling]
        self._normalize = config.normalize

    def options(self, truncate: bool = True) -> EmbedOptions:
        return EmbedOptions(truncate=truncate)

    def prepare(self, inputs: Sequence[str], encoder: TextEncoder, options: EmbedOptions) -> Prepared:
        return one_per_input(inputs, encoder.encode(inputs, truncate=options.truncate))

    def reduce(self, outputs: dict[str, np.ndarray], attention_mask: np.ndarray) -> list[np.ndarray]:
        pooled = self._pool(outputs["last_hidden_state"].astype(np.float32), attention_mask)
        if self._normalize:
            pooled = pooled / np.clip(np.linalg.norm(pooled, axis=1, keepdims=True), 1e-12, None)
        return list(pooled)

    def finalize(
        self, prepared: Prepared, reduced: list[Any], options: EmbedOptions, encoder: TextEncoder,
        config: TaskConfig,
    ) -> list[np.ndarray]:
        return reduced

    def comparable(self, reduced: np.ndarray) -> np.ndarray:
        return reduced
