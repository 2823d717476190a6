"""The task protocol: pre-processing into features, per-feature reduction, and final results."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np
from tokenizers import Encoding

from kiln.choices import TaskName
from kiln.taskconfig import TaskConfig
from kiln.tokenization import TextEncoder


@dataclass
class Prepared:
    """Model-ready features for a list of inputs; QA can map one input to several windows."""

    inputs: list[Any]
    encodings: list[Encoding]
    owners: list[int]  # index into ``inputs`` for every feature
    truncated: list[bool] = field(default_factory=list)  # per input


class TaskHandler(Protocol):
    """One task's pre- and post-processing. Engines only ever see padded id arrays."""

    name: TaskName
    output_names: tuple[str, ...]

    def options(self, **kwargs: Any) -> Any:
        """Validate per-call options (top_k, aggregation, …) into a frozen options object."""

    def prepare(self, inputs: Sequence[Any], encoder: TextEncoder, options: Any) -> Prepared:
        """Tokenize inputs into features."""

    def reduce(self, outputs: dict[str, np.ndarray], attention_mask: np.ndarray) -> list[Any]:
        """Turn one padded batch of raw outputs into one value per row (pooled vector, logits…)."""

    def finalize(
        self, prepared: Prepared, reduced: list[Any], options: Any, encoder: TextEncoder, config: TaskConfig
    ) -> list[Any]:
        """Combine the reduced features of each input into its result."""

    def comparable(self, reduced: Any) -> np.ndarray:
        """A flat float vector for one feature, used by parity and agreement checks."""


def one_per_input(inputs: Sequence[Any], encodings: list[Encoding]) -> Prepared:
    return Prepared(
        inputs=list(inputs),
        encodings=encodings,
        owners=list(range(len(inputs))),
        truncated=[len(e.overflowing) > 0 for e in encodings],
    )


def softmax(x: np.ndarray, axis: int = -1) -> np.ndarray:
    shifted = np.exp(x - x.max(axis=axis, keepdims=True))
    return shifted / shifted.sum(axis=axis, keepdims=True)


def sigmoid(x: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-x))


def valid_rows(array: np.ndarray, attention_mask: np.ndarray) -> list[np.ndarray]:
    """Split a padded [batch, seq, …] array into per-row arrays cut to each row's real length."""
    lengths = attention_mask.sum(axis=1).astype(int)
    return [array[i, : lengths[i]] for i in range(array.shape[0])]
