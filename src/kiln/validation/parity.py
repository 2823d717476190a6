"""Parity: how closely a variant reproduces the fp32 PyTorch original on the same inputs."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from kiln.errors import UsageError
from kiln.runtime.predictor import Predictor
from kiln.validation.figures import bucket_index, bucket_label


@dataclass(frozen=True)
class ParityTolerance:
    max_abs_diff: float = 1e-4
    min_cosine: float = 0.99999

    def __post_init__(self) -> None:
        if not self.max_abs_diff > 0:
            raise UsageError(f"--atol must be greater than 0 (got {self.max_abs_diff})")
        if not 0 < self.min_cosine <= 1:
            raise UsageError(f"--min-cosine must be between 0 and 1 (got {self.min_cosine})")


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


def cosine(a: np.ndarray, b: np.ndarray) -> float:
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    denom = np.linalg.norm(a64) * np.linalg.norm(b64)
    return float(a64 @ b64 / denom) if denom > 0 else float(np.array_equal(a64, b64))


@dataclass(frozen=True)
class Expected:
    """The reference's outputs on the parity inputs, run one input at a time: taken before the candidate loads, so
    the PyTorch original can be freed first (a 2.7B decoder's fp32 weights and its ONNX copy do not fit together
    in 24 GiB)."""

    encodings: list
    outputs: list[np.ndarray]

    @property
    def lengths(self) -> list[int]:
        return [len(e.ids) for e in self.encodings]


def expected_outputs(reference: Predictor, inputs: Sequence[Any]) -> Expected:
    prepared = reference.prepare(inputs)
    return Expected(prepared.encodings, _comparable(reference, prepared.encodings, 1))


def compare_parity(expected: Expected, candidate: Predictor, *, batch_sizes: Sequence[int] = (1, 8),
                   tolerance: ParityTolerance = ParityTolerance()) -> ParityReport:
    """Compare the candidate at each batch size with the reference's outputs.

    Batches are formed in input order (not length-sorted) so short inputs sit in batches padded to long
    ones: parity and batch-vs-single invariance are checked together.
    """
    lengths = expected.lengths
    diffs: list[float] = []
    cosines: list[float] = []
    buckets: list[int] = []
    for batch_size in batch_sizes:
        got = _comparable(candidate, expected.encodings, batch_size)
        for n, want, have in zip(lengths, expected.outputs, got):
            diffs.append(float(np.max(np.abs(want - have))) if want.size else 0.0)
            cosines.append(cosine(want, have))
            buckets.append(bucket_index(n))
        del got
    return ParityReport(
        batch_sizes=tuple(batch_sizes), features=len(lengths), max_abs_diff=max(diffs),
        min_cosine=min(cosines), mean_cosine=float(np.mean(cosines)),
        buckets=tuple(_bucket(i, diffs, cosines, buckets, len(batch_sizes)) for i in sorted(set(buckets))),
        tolerance=tolerance,
    )


def _comparable(predictor: Predictor, encodings: list, batch_size: int) -> list[np.ndarray]:
    runner = predictor.with_batch_size(batch_size)
    return [runner.handler.comparable(r) for r in runner.run_features(encodings, sort=False)]


def _bucket(
    index: int, diffs: list[float], cosines: list[float], buckets: list[int], runs: int
) -> BucketParity:
    chosen = [k for k, b in enumerate(buckets) if b == index]
    return BucketParity(
        tokens=bucket_label(index), count=len(chosen) // runs,
        max_abs_diff=max(diffs[k] for k in chosen), min_cosine=min(cosines[k] for k in chosen),
        mean_cosine=float(np.mean([cosines[k] for k in chosen])),
    )
