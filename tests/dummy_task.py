"""A task that exists only in the tests: the L2 norm of every token's hidden state.

It proves that a new task is one module (this one: its export, validation and runtime parts; a task without a wire
part is served by no route) plus one registry line: nothing else in kiln names it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from kiln.records.figures import Agreement, AgreementInputs, EvalSet, Run
from kiln.tasks.arrays import valid_rows
from kiln.tasks.base import TaskSpec
from kiln.tasks.export import TaskExport
from kiln.tasks.files import field
from kiln.tasks.validation import TaskValidation


@dataclass(frozen=True)
class NormOptions:
    truncate: bool = True


class TokenNormsExport(TaskExport):
    auto_class = "AutoModel"
    output_names = ("last_hidden_state",)
    sequence_outputs = frozenset(output_names)
    needs_trained_head = False


class TokenNormsValidation(TaskValidation):
    name = "token-norms"
    default_tolerance = 0.01
    tolerance_help = "min cosine of the norm vectors >= 1-t"
    metric = "neg_mae"
    eval_fields = ("text", "mean_norm")

    @classmethod
    def agreement(cls, data: AgreementInputs, variant: Run) -> Agreement:
        cos = np.array([float(a @ b / np.linalg.norm(a) / np.linalg.norm(b))
                        for a, b in zip(data.reference.reduced, variant.reduced)])
        return Agreement.of("min_cosine", {"min_cosine": float(cos.min())}, data.lengths(), cos, "cosine")

    @classmethod
    def parse_row(cls, row: Mapping[str, Any], where: str) -> tuple[Any, Any]:
        return field(row, "text", where), field(row, "mean_norm", where, float)

    @classmethod
    def evaluate(cls, predictor, data: EvalSet) -> dict[str, float]:
        got = [float(np.mean(r)) for r in predictor.predict(list(data.inputs))]
        return {"neg_mae": -float(np.mean(np.abs(np.array(got) - np.array(data.labels))))}


class TokenNorms(TaskSpec):
    name = "token-norms"
    export = TokenNormsExport
    validation = TokenNormsValidation

    def options(self, truncate: bool = True) -> NormOptions:
        return NormOptions(truncate)

    def reduce(self, outputs: dict[str, np.ndarray], attention_mask: np.ndarray) -> list[np.ndarray]:
        return [np.linalg.norm(row, axis=-1) for row in valid_rows(outputs["last_hidden_state"], attention_mask)]

    def finalize(self, prepared, reduced: Sequence[Any], options: NormOptions, encoder) -> list[list[float]]:
        return [[float(x) for x in norms] for norms in reduced]
