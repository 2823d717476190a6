"""Array helpers every task part shares: softmax, sigmoid, and a padded batch cut into its rows."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    pass


def softmax(x: np.ndarray, axis: int = -1) -> np.ndarray:
    shifted = np.exp(x - x.max(axis=axis, keepdims=True))
    return shifted / shifted.sum(axis=axis, keepdims=True)


def sigmoid(x: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-x))


def valid_rows(array: np.ndarray, attention_mask: np.ndarray) -> list[np.ndarray]:
    """Split a padded [batch, seq, …] array into per-row arrays cut to each row's real length."""
    lengths = attention_mask.sum(axis=1).astype(int)
    return [array[i, : lengths[i]] for i in range(array.shape[0])]
