"""Parity: how closely a variant reproduces the fp32 PyTorch original on the same inputs."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from kiln.records.figures import bucket_index, bucket_label
from kiln.records.parity import BucketParity, ParityReport, ParityTolerance
from kiln.runtime.predictor import Predictor
from kiln.scoring import cosine


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
