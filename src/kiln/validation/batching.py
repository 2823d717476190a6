"""Agreement under the batchings a served variant meets, and how much a text's answer moves between them.

A server batches whatever requests arrive together: the same text may run alone, in a batch of mixed lengths
(padded to the longest), or in a length-sorted batch. Dynamic int8 computes its activation scale per tensor, i.e.
per batch, so the text's answer depends on its neighbours: measured on MiniLM, onnx-int8-dynamic passed the gate
at min cosine 0.9901 in sorted batches and fell to 0.9877 of itself when run alone. The gate must judge the worst
batching, not the friendliest, and the drift (the same input's output across batchings) is a figure of its own:
zero means the variant is batch-invariant, which ``kiln serve --deterministic`` requires.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from kiln.choices import Batching
from kiln.records.batching import BatchDrift, BatchedAgreement
from kiln.records.figures import Agreement, AgreementInputs, Run
from kiln.runtime.features import Prepared
from kiln.runtime.predictor import Predictor
from kiln.scoring import cosine
from kiln.system.memory import trim_heap
from kiln.tasks import task_spec
from kiln.validation.spill import spilled


def _plans(candidate: Predictor, sessions: Predictor | Callable[[], Predictor] | None, count: int
           ) -> dict[Batching, Callable[[], tuple[Predictor, bool]]]:
    """How each batching runs the ``count`` prepared inputs (the predictor, made only when its batching is
    reached, and whether its batches are formed by length), cheapest first (so a hopeless variant stops after one
    batched pass), alone second: every later batching's drift is measured against it. ``sessions``: a predictor,
    or what makes one (a rejected variant never loads its extra sessions).

    Mixed batches are planned only when the inputs fill more than one batch: in one batch, arrival order is the
    sorted batch with its rows in another order, the same padded computation (a decoder's 32 agreement texts at
    batch 32 ran it twice: 10 s of each GPT-2 small check, benchmarks/optimize_profile.py)."""
    plans: dict[Batching, Callable[[], tuple[Predictor, bool]]] = {
        Batching.SORTED: lambda: (candidate, True),
        Batching.ALONE: lambda: (candidate.with_batch_size(1), True),
    }
    if count > candidate.batch_size:
        plans[Batching.MIXED] = lambda: (candidate, False)
    if sessions is not None:
        plans[Batching.SESSIONS] = lambda: (sessions if isinstance(sessions, Predictor) else sessions(), True)
    return plans


class _DriftMeter:
    """The drift of each batching from the alone run, taken as each batching runs (so only the alone run, the
    current one and, until the alone run exists, the sorted one are held: a decoder's logits are ~0.5 GB a run on
    GPT-2 small)."""

    def __init__(self, candidate: Predictor, data: AgreementInputs, prepared: Prepared, alone: Run) -> None:
        self.spec, self.handler = task_spec(candidate.config.task), candidate.handler
        self.data, self.prepared, self.alone = data, prepared, alone
        self.worst_diff, self.worst_cos, self.consistency, self.figure = 0.0, 1.0, 1.0, ""

    def add(self, run: Run) -> None:
        for a, b in zip(self.alone.reduced, run.reduced):
            x, y = self.handler.comparable(a).astype(np.float64), self.handler.comparable(b).astype(np.float64)
            self.worst_diff = max(self.worst_diff, float(np.max(np.abs(x - y))) if x.size else 0.0)
            self.worst_cos = min(self.worst_cos, cosine(x, y))
            if x.nbytes >= 2**20:  # a decoder's rows: 50k-vocabulary float64 temporaries glibc keeps otherwise
                trim_heap()
        # The task's own agreement, with the alone run as the reference: the share of labels, ranks or next
        # tokens that stay the same, or the cosine, between batchings.
        # (The candidate against itself: one space, whatever the original's.)
        alone = AgreementInputs(self.prepared, self.alone, self.data.config)
        against_alone = self.spec.validation.agreement(alone, run)
        if against_alone.value <= self.consistency:
            self.consistency, self.figure = against_alone.value, against_alone.primary

    def result(self) -> BatchDrift:
        return BatchDrift(self.worst_diff, self.worst_cos, self.consistency, self.figure or "identical")


def measure_batchings(data: AgreementInputs, candidate: Predictor,
                      sessions: Predictor | Callable[[], Predictor] | None = None,
                      hopeless: Callable[[Agreement], bool] | None = None) -> BatchedAgreement:
    """Agreement with the original alone, in sorted batches and in mixed batches (and, given ``sessions``, the same
    variant loaded as several one-thread sessions), and the drift between them. ``hopeless``: given, the batchings
    stop at the first whose agreement it calls failing: the gate judges the worst batching, so no later one can
    make the variant pass (``complete`` is then False and the drift covers the batchings run)."""
    spec = task_spec(candidate.config.task)
    prepared = data.prepared_for(candidate)
    handler, options = candidate.handler, candidate.handler.options()
    agreements: dict[Batching, Agreement] = {}
    meter: _DriftMeter | None = None
    sorted_run: Run | None = None  # kept until the alone run exists to measure its drift against
    plans = _plans(candidate, sessions, len(prepared.encodings))
    for batching, plan in plans.items():
        runner, by_length = plan()
        reduced = runner.run_features(prepared.encodings, sort=by_length)
        run = Run(tuple(reduced), tuple(handler.finalize(prepared, reduced, options, candidate.encoder)))
        # A decoder's own greedy continuations too, batched as this batching batches
        agreements[batching] = spec.validation.with_generation(spec.validation.agreement(data, run), data, runner)
        if batching is Batching.SORTED:
            sorted_run = spilled(run)  # a decoder's logits wait on disk for the alone run
        elif batching is Batching.ALONE:
            meter = _DriftMeter(candidate, data, prepared, run)
            meter.add(sorted_run)
            sorted_run = None
        else:
            meter.add(run)
        del reduced, run  # the next batching's outputs take their place
        if hopeless is not None and hopeless(agreements[batching]):
            break
    drift = meter.result() if meter is not None else BatchDrift(0.0, 1.0, 1.0, "not measured (rejected early)")
    return BatchedAgreement(agreements, drift, complete=len(agreements) == len(plans))
