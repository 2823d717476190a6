"""text-classification's validation part: the top label kept; accuracy and F1 as the task metric; labelled rows
as a student's cross-entropy targets."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from kiln.data.texts import builtin_pairs
from kiln.errors import UsageError
from kiln.records.figures import Agreement, AgreementInputs, EvalSet, Run
from kiln.tasks.arrays import softmax
from kiln.tasks.files import field
from kiln.tasks.inputs import TextPair
from kiln.tasks.validation import NO_LABEL, TaskValidation

if TYPE_CHECKING:
    from kiln.runtime.features import Prepared


class TextClassificationValidation(TaskValidation):
    name = "text-classification"
    default_tolerance = 0.01
    tolerance_help = "top label agreement >= 1-t"
    metric = "accuracy"
    eval_fields = ("text", "label")
    live_figure = "label_agreement"  # the gate's figure, per input: the top label kept (1) or not (0)
    live_judged = "mean"

    @classmethod
    def live_agreement(cls, handler: Any, served: Any, reference: Any) -> float:
        a, b = np.asarray(served).reshape(-1), np.asarray(reference).reshape(-1)
        if a.size == 1:  # one logit: the label is its sign
            return float((a[0] > 0) == (b[0] > 0))
        return float(int(a.argmax()) == int(b.argmax()))

    @classmethod
    def agreement_inputs(cls, encoder, count: int = 128) -> list[Any]:
        singles = super().agreement_inputs(encoder, count - count // 4)
        return [*singles, *(TextPair(a, b) for a, b in builtin_pairs(count // 4, seed=7))]

    @classmethod
    def agreement(cls, data: AgreementInputs, variant: Run) -> Agreement:
        ref, got = softmax(np.stack(data.reference.reduced)), softmax(np.stack(variant.reduced))
        agree = (ref.argmax(1) == got.argmax(1)).astype(np.float64)
        figures = {"label_agreement": float(agree.mean()), "max_probability_diff": float(np.abs(ref - got).max())}
        return Agreement.of("label_agreement", figures, data.lengths(), agree, "agreement")

    @classmethod
    def parse_row(cls, row: Mapping[str, Any], where: str) -> tuple[Any, Any]:
        """``text`` (+ optional ``text_pair``), or GLUE's ``sentence1``/``sentence2``; and ``label``."""
        if "sentence1" in row:
            item: str | TextPair = TextPair(field(row, "sentence1", where), field(row, "sentence2", where))
        elif row.get("text_pair") not in (None, ""):
            item = TextPair(field(row, "text", where), field(row, "text_pair", where))
        else:
            item = field(row, "text", where)
        return item, field(row, "label", where)

    @classmethod
    def training_labels(cls, prepared: Prepared, labels: Sequence[Any], config, encoder) -> dict[str, list[np.ndarray]]:
        """The class index of each row's label (a name of the model's id2label, or its index)."""
        if config.problem_type == "multi_label_classification" or len(config.id2label) < 2:
            raise UsageError("labelled rows (--train) train single-label classifiers with 2+ labels; pass the "
                             "texts with --texts and the teacher labels them")
        by_name = {name: i for i, name in config.id2label.items()}

        def index(label: Any, row: int) -> int:
            if label is None:
                return NO_LABEL  # unlabelled: the teacher alone is the target
            text = str(label)
            if text in by_name:
                return by_name[text]
            if text.isdigit() and int(text) in config.id2label:
                return int(text)
            raise UsageError(f"train row {row + 1}: label {text!r} is not one of the model's labels: "
                             f"{', '.join(by_name)}")

        return {"logits": [np.array(index(labels[owner], owner)) for owner in prepared.owners]}

    @classmethod
    def evaluate(cls, predictor, data: EvalSet) -> dict[str, float]:
        from sklearn.metrics import accuracy_score, f1_score

        predicted = [r[0].label for r in predictor.predict(list(data.inputs))]
        id2label = predictor.config.id2label
        gold = [id2label.get(int(g), g) if g.isdigit() else g for g in data.labels]
        scores = {"accuracy": float(accuracy_score(gold, predicted)),
                  "f1_macro": float(f1_score(gold, predicted, average="macro", labels=sorted(set(gold))))}
        labels = [id2label[i] for i in sorted(id2label)] if len(id2label) == 2 else sorted(set(gold))
        if len(labels) == 2:  # MRPC's F1: the positive class is the second label
            scores["f1"] = float(f1_score(gold, predicted, pos_label=labels[1], average="binary"))
        return scores

    @classmethod
    def eval_inputs(cls, data: EvalSet) -> list[Any]:
        return list(data.inputs)
