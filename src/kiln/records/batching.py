"""Agreement under each batching a served variant meets, and the drift of one input's output between them."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from kiln.choices import Batching
from kiln.records.figures import Agreement


@dataclass(frozen=True)
class BatchDrift:
    """How far one input's output moves between batchings (each compared with the same input run alone)."""

    max_abs_diff: float  # the largest |difference| of any output value
    min_cosine: float  # the smallest cosine between an input's output vectors
    consistency: float  # the task's primary agreement figure of each batching against alone (its worst)
    figure: str  # that figure's name: labels kept, ranks kept, cosine, next tokens kept

    @property
    def invariant(self) -> bool:
        """Bit-identical answers whatever the batch."""
        return self.max_abs_diff == 0.0

    def describe(self) -> str:
        if self.invariant:
            return "batch-invariant"
        return f"max abs diff {self.max_abs_diff:.1e}, min cosine {self.min_cosine:.5f} ({self.figure} " \
               f"{self.consistency:.4f})"


@dataclass(frozen=True)
class BatchedAgreement:
    """The variant's agreement with the original under each batching, and its drift between them."""

    agreements: Mapping[Batching, Agreement]
    drift: BatchDrift
    complete: bool = True  # False: the batchings stopped at one the gate fails (measure_batchings' ``hopeless``)

    @property
    def worst(self) -> Batching:
        """The batching the gate judges: the lowest primary agreement."""
        # Ties go to the batching named first in Batching (sorted: the offline path), whatever order they ran in.
        return min((b for b in Batching if b in self.agreements), key=lambda b: self.agreements[b].value)
