"""Timing a predictor on a length mix: length-sorted batches, tokenization excluded, best of rounds."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from tokenizers import Encoding

from kiln.runtime import Predictor


@dataclass(frozen=True)
class Timing:
    sequences: int
    seconds: float
    batch_size: int

    @property
    def ms_per_sequence(self) -> float:
        return 1000 * self.seconds / self.sequences

    @property
    def sequences_per_second(self) -> float:
        return self.sequences / self.seconds

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "ms_per_sequence": self.ms_per_sequence,
                "sequences_per_second": self.sequences_per_second}


def time_predictor(predictor: Predictor, encodings: Sequence[Encoding], *, rounds: int = 2) -> Timing:
    """Best wall time over ``rounds`` passes of sorted batches (after one warm-up batch)."""
    predictor.run_features(list(encodings[: predictor.batch_size]))
    best = float("inf")
    for _ in range(rounds):
        start = time.perf_counter()
        predictor.run_features(encodings, sort=True)
        best = min(best, time.perf_counter() - start)
    return Timing(len(encodings), best, predictor.batch_size)
