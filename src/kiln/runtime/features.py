"""Model-ready features: what a task's pre-processing hands the predictor."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
from tokenizers import Encoding

from kiln.records.task import TaskConfig


@dataclass(frozen=True)
class Prepared:
    """Model-ready features for a list of inputs; QA can map one input to several windows."""

    inputs: tuple[Any, ...]
    encodings: tuple[Encoding, ...]
    owners: tuple[int, ...]  # index into ``inputs`` for every feature
    truncated: tuple[bool, ...]  # per input


def one_per_input(inputs: Sequence[Any], encodings: Sequence[Encoding]) -> Prepared:
    return Prepared(tuple(inputs), tuple(encodings), tuple(range(len(inputs))),
                    tuple(len(e.overflowing) > 0 for e in encodings))


class TaskRuntime(Protocol):
    """What the predictor asks of a task: its per-call part for one model (a ``kiln.tasks`` spec instance).

    Declared here, where it is used, so the runtime depends on no task: tasks sit above it and implement it."""

    config: TaskConfig
    embeds: bool
    output_calibration: np.ndarray | None
    stored_vectors: tuple[Any, ...]

    def adapt_engine(self, engine: Any, config: TaskConfig) -> Any: ...
    def predict(self, predictor: Any, inputs: Sequence[Any], **options: Any) -> list[Any]: ...
    def rerank(self, predictor: Any, query: str, texts: Sequence[str], **options: Any) -> list[Any]: ...
    def generate(self, predictor: Any, prompts: Any, **options: Any) -> Any: ...
    def features(self, inputs: Sequence[Any], encoder: Any, options: Any = None) -> Prepared: ...
    def run_batch(self, engine: Any, arrays: dict[str, np.ndarray]) -> list[Any]: ...
