"""Export parity: how far a graph's outputs are from the PyTorch model's, overall and per length bucket."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from kiln.errors import UsageError


@dataclass(frozen=True)
class ParityTolerance:
    max_abs_diff: float = 1e-4
    min_cosine: float = 0.99999

    def __post_init__(self) -> None:
        if not self.max_abs_diff > 0:
            raise UsageError(f"atol must be greater than 0 (got {self.max_abs_diff})")
        if not 0 < self.min_cosine <= 1:
            raise UsageError(f"min_cosine must be between 0 and 1 (got {self.min_cosine})")


@dataclass(frozen=True)
class BucketParity:
    tokens: str
    count: int
    max_abs_diff: float
    min_cosine: float
    mean_cosine: float


@dataclass(frozen=True)
class ParityReport:
    batch_sizes: tuple[int, ...]
    features: int
    max_abs_diff: float
    min_cosine: float
    mean_cosine: float
    buckets: tuple[BucketParity, ...]
    tolerance: ParityTolerance

    @property
    def passed(self) -> bool:
        return self.max_abs_diff <= self.tolerance.max_abs_diff and self.min_cosine >= self.tolerance.min_cosine

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "passed": self.passed}

    def summary(self) -> str:
        return (f"max |diff| {self.max_abs_diff:.2e} (limit {self.tolerance.max_abs_diff:.0e}), "
                f"cosine min {self.min_cosine:.6f} / mean {self.mean_cosine:.6f} "
                f"(limit {self.tolerance.min_cosine}) over {self.features} features, "
                f"batch sizes {', '.join(map(str, self.batch_sizes))}")
