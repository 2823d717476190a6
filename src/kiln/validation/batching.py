"""Agreement under the batchings a served variant meets, and how much a text's answer moves between them.

A server batches whatever requests arrive together: the same text may run alone, in a batch of mixed lengths
(padded to the longest), or in a length-sorted batch. Dynamic int8 computes its activation scale per tensor, i.e.
per batch, so the text's answer depends on its neighbours: measured on MiniLM, onnx-int8-dynamic passed the gate
at min cosine 0.9901 in sorted batches and fell to 0.9877 of itself when run alone. The gate must judge the worst
batching, not the friendliest, and the drift (the same input's output across batchings) is a figure of its own:
zero means the variant is batch-invariant, which ``kiln serve --deterministic`` requires.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from kiln.choices import Choice
from kiln.runtime.predictor import Predictor
from kiln.tasks import task_spec
from kiln.tasks.base import Prepared
from kiln.validation.figures import Agreement, AgreementInputs, Run
from kiln.validation.parity import cosine


class Batching(Choice):
    """How a served variant's inputs may be grouped."""

    SORTED = "sorted"  # length-sorted batches at the batch size, padded to the engine's multiple (offline path)
    MIXED = "mixed"  # arrival order: mixed lengths in one batch, padded to the longest (a busy server)
    ALONE = "alone"  # batch of one, no padding (an idle server)
    # Sorted batches spread over two engine sessions of one thread each, run side by side: the plan kiln bench
    # picks when sessions x threads beats one wide session (OpenVINO streams, ORT sessions). Fewer threads may
    # change a kernel's reduction order, so a text's answer could depend on which plan serves it.
    SESSIONS = "sessions"


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

    @property
    def worst(self) -> Batching:
        """The batching the gate judges: the lowest primary agreement."""
        return min(self.agreements, key=lambda b: self.agreements[b].value)


def _runs(candidate: Predictor, prepared: Prepared, sessions: Predictor | None) -> dict[Batching, Run]:
    handler = candidate.handler
    options = handler.options()
    reduced = {
        Batching.SORTED: candidate.run_features(prepared.encodings, sort=True),
        Batching.MIXED: candidate.run_features(prepared.encodings, sort=False),
        Batching.ALONE: candidate.with_batch_size(1).run_features(prepared.encodings),
    }
    if sessions is not None:
        reduced[Batching.SESSIONS] = sessions.run_features(prepared.encodings, sort=True)
    return {b: Run(tuple(r), tuple(handler.finalize(prepared, r, options, candidate.encoder)))
            for b, r in reduced.items()}


def _drift(candidate: Predictor, data: AgreementInputs, prepared: Prepared,
           runs: Mapping[Batching, Run]) -> BatchDrift:
    spec, handler = task_spec(candidate.config.task), candidate.handler
    alone = runs[Batching.ALONE]
    worst_diff, worst_cos, consistency, figure = 0.0, 1.0, 1.0, ""
    for batching, run in runs.items():
        if batching is Batching.ALONE:
            continue
        for a, b in zip(alone.reduced, run.reduced):
            x, y = handler.comparable(a).astype(np.float64), handler.comparable(b).astype(np.float64)
            worst_diff = max(worst_diff, float(np.max(np.abs(x - y))) if x.size else 0.0)
            worst_cos = min(worst_cos, cosine(x, y))
        # The task's own agreement, with the alone run as the reference: the share of labels, ranks or next
        # tokens that stay the same, or the cosine, between batchings.
        # (The candidate against itself: one space, whatever the original's.)
        against_alone = spec.agreement(AgreementInputs(prepared, alone, data.config), run)
        if against_alone.value <= consistency:
            consistency, figure = against_alone.value, against_alone.primary
    return BatchDrift(worst_diff, worst_cos, consistency, figure or "identical")


def measure_batchings(data: AgreementInputs, candidate: Predictor,
                      sessions: Predictor | None = None) -> BatchedAgreement:
    """Agreement with the original in sorted batches, mixed batches and alone (and, given ``sessions``, the same
    variant loaded as several one-thread sessions), and the drift between them."""
    spec = task_spec(candidate.config.task)
    prepared = data.prepared_for(candidate)
    runs = _runs(candidate, prepared, sessions)
    return BatchedAgreement({b: spec.agreement(data, run) for b, run in runs.items()},
                            _drift(candidate, data, prepared, runs))
