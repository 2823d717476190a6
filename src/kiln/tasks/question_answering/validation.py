"""question-answering's validation part: answer F1 against the original's answers; SQuAD's exact match and F1 as the
task metric."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from kiln.data.texts import builtin_sentences, joined
from kiln.errors import UsageError
from kiln.records.figures import Agreement, AgreementInputs, EvalSet, Run
from kiln.scoring import squad_scores
from kiln.tasks.files import field
from kiln.tasks.inputs import QAInput
from kiln.tasks.validation import NO_LABEL, TaskValidation

if TYPE_CHECKING:
    from kiln.runtime.features import Prepared


def builtin_questions(count: int, seed: int = 0) -> list[QAInput]:
    """Questions are built-in sentences; contexts are paragraphs of 1-8 other sentences."""
    n = len(builtin_sentences())
    return [QAInput(builtin_sentences()[(seed + 7 * i) % n], joined(seed + 11 * i + 3, 1 + (i % 8)))
            for i in range(count)]


def _answer_list(value: Any) -> list[str]:
    if isinstance(value, list):
        return [str(v) for v in value]
    if isinstance(value, str):
        return [value] if value else []
    raise TypeError("expected a list of answer strings")


class QuestionAnsweringValidation(TaskValidation):
    name = "question-answering"
    default_tolerance = 0.02
    tolerance_help = "answer F1 against the original's answers >= 1-t"
    metric = "f1"
    eval_fields = ("question", "context", "answers")
    eval_formats = (".jsonl", ".csv", "SQuAD .json")

    @classmethod
    def agreement_inputs(cls, encoder, count: int = 128) -> list[Any]:
        return builtin_questions(count // 4, seed=1)

    @classmethod
    def calibration_inputs(cls, encoder, count: int = 128) -> list[Any]:
        return builtin_questions(count // 4, seed=5)

    @classmethod
    def timing_inputs(cls, encoder, count: int = 256) -> list[Any]:
        return builtin_questions(count // 4, seed=9)

    @classmethod
    def training_labels(cls, prepared: Prepared, labels: Sequence[Any], config, encoder) -> dict[str, list[np.ndarray]]:
        """Start and end token of each row's first answer (found in its context) in every window that holds it
        whole; a window without it, or a row with no answer (SQuAD 2), points at the first token, as the
        original SQuAD training does. Unlabelled rows: no target."""
        starts, ends = [], []
        for owner, encoding in zip(prepared.owners, prepared.encodings):
            answers = labels[owner]
            start = end = NO_LABEL
            if answers is not None:
                start = end = 0
                if answers:
                    context = prepared.inputs[owner].context
                    begin = context.find(answers[0])
                    if begin < 0:
                        raise UsageError(f"train row {owner + 1}: answer {answers[0]!r} is not in its context")
                    tokens = [t for t, seq in enumerate(encoding.sequence_ids) if seq == 1]
                    first = [t for t in tokens if encoding.offsets[t][0] <= begin < encoding.offsets[t][1]]
                    last = [t for t in tokens if encoding.offsets[t][0] < begin + len(answers[0])
                            <= encoding.offsets[t][1]]
                    if first and last:
                        start, end = first[0], last[-1]
            starts.append(np.array(start))
            ends.append(np.array(end))
        return {"start_logits": starts, "end_logits": ends}

    @classmethod
    def agreement(cls, data: AgreementInputs, variant: Run) -> Agreement:
        ref = [r[0].answer if r else "" for r in data.reference.results]
        got = [r[0].answer if r else "" for r in variant.results]
        per_item = np.array([squad_scores([g], [[r]])["f1"] for r, g in zip(ref, got)])
        scores = squad_scores(got, [[r] for r in ref])
        figures = {"answer_exact_match": scores["exact_match"], "answer_f1": scores["f1"]}
        return Agreement.of("answer_f1", figures, data.lengths(), per_item, "f1")

    @classmethod
    def parse_row(cls, row: Mapping[str, Any], where: str) -> tuple[Any, Any]:
        item = QAInput(field(row, "question", where), field(row, "context", where))
        return item, tuple(field(row, "answers", where, _answer_list, optional_empty=True))

    @classmethod
    def read_eval(cls, path: Path) -> EvalSet:
        if path.suffix.lower() != ".json":
            return super().read_eval(path)
        try:
            data = json.loads(path.read_text(encoding="utf-8"))["data"]
        except (json.JSONDecodeError, KeyError, TypeError) as err:
            raise UsageError(f"{path}: not a SQuAD file (expected {{'data': [{{'paragraphs': …}}]}}): {err}") from err
        inputs, answers = [], []
        for article in data:
            for paragraph in article.get("paragraphs", []):
                for qa in paragraph.get("qas", []):
                    inputs.append(QAInput(qa["question"], paragraph["context"]))
                    answers.append(() if qa.get("is_impossible", False)
                                   else tuple(a["text"] for a in qa.get("answers", [])))
        return EvalSet(cls.name, str(path), tuple(inputs), tuple(answers))

    @classmethod
    def evaluate(cls, predictor, data: EvalSet) -> dict[str, float]:
        allow_null = any(not a for a in data.labels)
        results = predictor.predict(list(data.inputs), allow_null=allow_null)
        return squad_scores([r[0].answer if r else "" for r in results], data.labels)
