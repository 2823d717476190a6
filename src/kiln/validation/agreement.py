"""Agreement: how closely a variant reproduces the fp32 original's task outputs (the task spec says how)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from kiln.records.figures import Agreement, AgreementInputs, Run
from kiln.runtime.features import Prepared
from kiln.runtime.predictor import Predictor
from kiln.tasks import task_spec
from kiln.validation.spill import spilled


def run(predictor: Predictor, prepared: Prepared) -> Run:
    """The predictor's reduced outputs and final results on already-prepared inputs."""
    options = predictor.handler.options()
    reduced = predictor.run_features(prepared.encodings)
    return Run(tuple(reduced), tuple(predictor.handler.finalize(prepared, reduced, options, predictor.encoder)))


def agreement_inputs(reference: Predictor, inputs: Sequence[Any]) -> AgreementInputs:
    prepared = reference.prepare(inputs)
    # Held for as long as variants are judged: a decoder's logits go to disk (kiln.validation.spill).
    return AgreementInputs(prepared, spilled(run(reference, prepared)), reference.config)


def measure_agreement(data: AgreementInputs, candidate: Predictor) -> Agreement:
    return task_spec(candidate.config.task).validation.agreement(data, run(candidate, data.prepared_for(candidate)))
