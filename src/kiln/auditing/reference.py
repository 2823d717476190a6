"""The original model's fp32 PyTorch vectors, as configured and as the usual misconfigurations would make them.

A :class:`Recipe` is one way of turning the model's token states into a vector: pooling, normalisation, the
truncation length and a prefix. The configured recipe (the model's sentence-transformers settings) is what a
deployment should reproduce; the others are what `kiln audit` tries, to find which one the deployment's vectors
actually match.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from kiln.choices import Pooling
from kiln.model.projected import token_states

POOLINGS = tuple(p.value for p in Pooling)  # the ones kiln reproduces, named as the artifact names them
TRUNCATIONS = (16, 32, 64, 128, 256, 384, 512)  # lengths servers commonly cut at


def position_limit(source: Any) -> int:
    """The most tokens the model takes: its position table, or its tokenizer's limit where that is lower."""
    positions = int(getattr(source.model.config, "max_position_embeddings", 0) or source.task_config.max_length)
    return min(positions, int(getattr(source.tokenizer, "model_max_length", positions) or positions))


def truncations(configured: int, limit: int, longest: int) -> list[int]:
    """Truncation lengths worth trying on inputs of up to ``longest`` tokens: the usual ones below it, the
    configured one, and ``min(limit, longest)`` (no cut at all, or the model's own limit; a server that ignores
    the configured length cuts there, as TEI does at the position table's size)."""
    top = min(limit, longest)
    return sorted({t for t in TRUNCATIONS if t < top} | {configured, top})


@dataclass(frozen=True)
class Recipe:
    pooling: str
    normalize: bool
    max_length: int
    prefix: str = ""

    def describe(self) -> str:
        prefix = f", prefix {self.prefix!r}" if self.prefix else ""
        return (f"{self.pooling} pooling, {'normalized' if self.normalize else 'not normalized'}, truncated at "
                f"{self.max_length} tokens{prefix}")

    def but(self, **changes: Any) -> Recipe:
        return replace(self, **changes)


class Reference:
    """The source model run eagerly in fp32; vectors cached per (recipe, texts)."""

    def __init__(self, source: Any, batch_size: int = 16) -> None:
        import torch

        self.model, self.tokenizer, self.batch_size = source.model.eval(), source.tokenizer, batch_size
        config = source.task_config
        self.configured = Recipe(config.pooling.value, config.normalize, config.max_length)
        self.limit = position_limit(source)
        self._torch = torch
        self._cache: dict[tuple[Recipe, tuple[str, ...]], np.ndarray] = {}

    def token_counts(self, texts: Sequence[str]) -> list[int]:
        """Tokens per text, special tokens included, untruncated."""
        return [len(ids) for ids in self.tokenizer(list(texts), add_special_tokens=True)["input_ids"]]

    def vectors(self, texts: Sequence[str], recipe: Recipe) -> np.ndarray:
        key = (recipe, tuple(texts))
        if key not in self._cache:
            # One forward pass serves every pooling and both normalisations of the same inputs, and the pooling
            # search asks for each: the bundled MiniLM's audit against a server spent 7.7 of its 46 s in the three
            # extra passes (cProfile of run_audit, 24 texts).
            batches = [self._batch([recipe.prefix + t for t in texts[i : i + self.batch_size]], recipe.max_length)
                       for i in range(0, len(texts), self.batch_size)]
            for way in batches[0]:
                pooling, normalize = way
                self._cache[(recipe.but(pooling=pooling, normalize=normalize), tuple(texts))] = \
                    np.concatenate([batch[way] for batch in batches])
        return self._cache[key]

    def _batch(self, texts: list[str], max_length: int) -> dict[tuple[str, bool], np.ndarray]:
        """The batch's vectors by (pooling, normalized)."""
        torch = self._torch
        enc = self.tokenizer(texts, truncation=True, max_length=max_length, padding=True, return_tensors="pt")
        with torch.inference_mode():  # an encoder's states, or projected ones (EmbeddingGemma's Dense modules)
            hidden = token_states(self.model, **enc).float()
            mask = enc["attention_mask"].unsqueeze(-1).float()
            pooled = {
                Pooling.MEAN.value: (hidden * mask).sum(1) / mask.sum(1).clamp(min=1),
                Pooling.CLS.value: hidden[:, 0],
                # each row's last real token, on either padding side
                Pooling.LASTTOKEN.value: hidden[torch.arange(hidden.shape[0]),
                                                (torch.arange(hidden.shape[1]) * enc["attention_mask"]).argmax(1)],
                Pooling.MAX.value: hidden.masked_fill(mask == 0, float("-inf")).max(1).values,  # over real tokens
            }
            return {(pooling, normalize): (torch.nn.functional.normalize(v, dim=-1) if normalize else v).numpy()
                    for pooling, v in pooled.items() for normalize in (False, True)}


def cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Row-wise cosine of two [n, d] arrays."""
    a, b = a.astype(np.float64), b.astype(np.float64)
    norm = np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1)
    return np.where(norm > 0, (a * b).sum(1) / np.maximum(norm, 1e-300), 0.0)
