"""sentence-transformers' similarity functions (``similarity_fn_name`` in config_sentence_transformers.json), for
``Predictor.similarity`` / ``similarity_pairwise``: the same names, formulas and shapes.

cosine and dot are the usual; euclidean and manhattan are negated distances, so a higher score is more similar
under every name, as sentence-transformers defines them. Results are torch tensors where torch is installed (what
sentence-transformers returns, so code calling ``.topk`` or ``.item`` runs unchanged), numpy arrays otherwise (the
serving-only install).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from kiln.choices import Similarity
from kiln.errors import UsageError

COSINE = Similarity.COSINE.value


def _unit(x: np.ndarray) -> np.ndarray:
    return x / np.clip(np.linalg.norm(x, axis=-1, keepdims=True), 1e-12, None)  # torch's normalize eps


def _cosine(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return _unit(a) @ _unit(b).T


def _euclidean(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return -np.sqrt(np.clip((a * a).sum(1)[:, None] + (b * b).sum(1)[None] - 2 * a @ b.T, 0, None))


MATRIX: dict[str, Callable[[np.ndarray, np.ndarray], np.ndarray]] = {
    COSINE: _cosine,
    Similarity.DOT.value: lambda a, b: a @ b.T,
    Similarity.EUCLIDEAN.value: _euclidean,
    Similarity.MANHATTAN.value: lambda a, b: -np.abs(a[:, None, :] - b[None, :, :]).sum(-1),
}
PAIRWISE: dict[str, Callable[[np.ndarray, np.ndarray], np.ndarray]] = {
    COSINE: lambda a, b: (_unit(a) * _unit(b)).sum(-1),
    Similarity.DOT.value: lambda a, b: (a * b).sum(-1),
    Similarity.EUCLIDEAN.value: lambda a, b: -np.sqrt(((a - b) ** 2).sum(-1)),
    Similarity.MANHATTAN.value: lambda a, b: -np.abs(a - b).sum(-1),
}


def _rows(x: Any) -> np.ndarray:
    """[n, d] float32 from an array, a tensor, or a list of vectors of either."""
    if hasattr(x, "detach"):
        x = x.detach().cpu().numpy()
    elif isinstance(x, list | tuple) and x and hasattr(x[0], "detach"):
        x = np.stack([v.detach().cpu().numpy() for v in x])
    rows = np.asarray(x, dtype=np.float32)
    return rows[None] if rows.ndim == 1 else rows


def _returned(scores: np.ndarray) -> Any:
    try:
        import torch
    except ImportError:
        return scores
    return torch.from_numpy(np.ascontiguousarray(scores, dtype=np.float32))


def similarity(name: str, a: Any, b: Any) -> Any:
    """[len(a), len(b)] scores of every pair."""
    return _returned(MATRIX[name](_rows(a), _rows(b)))


def similarity_pairwise(name: str, a: Any, b: Any) -> Any:
    """[len(a)] scores of a[i] with b[i]."""
    left, right = _rows(a), _rows(b)
    if left.shape != right.shape:
        raise UsageError(f"similarity_pairwise: both need the same shape (got {left.shape} and {right.shape})")
    return _returned(PAIRWISE[name](left, right))
