"""Agreement: how closely a variant reproduces the fp32 original's task outputs (the task spec says how)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from kiln.records.figures import Agreement, AgreementInputs, Run
from kiln.runtime.features import Prepared
from kiln.runtime.predictor import Predictor
from kiln.tasks import task_spec
from kiln.validation.spill import DiskRows, collected


def run(predictor: Predictor, prepared: Prepared) -> Run:
    """The predictor's reduced outputs and final results on already-prepared inputs; big outputs (a PyTorch
    decoder's logits) go to disk batch by batch as they come (kiln.validation.spill)."""
    options = predictor.handler.options()
    values = collected(predictor.iter_features(prepared.encodings), len(prepared.encodings))
    reduced = values.lazy() if isinstance(values, DiskRows) else values
    return Run(tuple(reduced), tuple(predictor.handler.finalize(prepared, reduced, options, predictor.encoder)))


def agreement_inputs(reference: Predictor, inputs: Sequence[Any],
                     generator: Callable[[], Predictor] | None = None) -> AgreementInputs:
    """The inputs prepared and the original's outputs on them. ``generator``: what makes the original as it
    generates (a decoder's step graph on its KV cache), asked for only by a task whose variants' own continuations
    are compared with the original's."""
    validation = task_spec(reference.config.task).validation
    cap = validation.reference_batch
    if cap is not None and reference.batch_size > cap:
        reference = reference.with_batch_size(cap)
    prepared = reference.prepare(inputs)
    continuations = validation.reference_continuations(generator) if generator is not None else None
    # Held for as long as variants are judged: run() has put a decoder's logits on disk as they came.
    return AgreementInputs(prepared, run(reference, prepared), reference.config, continuations=continuations)


def measure_agreement(data: AgreementInputs, candidate: Predictor) -> Agreement:
    validation = task_spec(candidate.config.task).validation
    found = validation.agreement(data, run(candidate, data.prepared_for(candidate)))
    return validation.with_generation(found, data, candidate)
