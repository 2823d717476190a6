"""Sequence classification of one text or a text pair: softmax (sigmoid for multi-label), id2label, top-k.

Pairs (paraphrase, NLI, cross-encoders) are tokenized as the model's tokenizer does pairs (token type ids
where the model has them); an over-long pair loses tokens from its longer text first (longest-first).
Agreement: the same top label as the original (gate: >= 1 - t). Task metric: accuracy, and F1 (binary F1 of
the second label, MRPC's, when there are two; macro F1 always). Route: POST /classify.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from kiln.data.texts import builtin_pairs
from kiln.errors import UsageError
from kiln.records.figures import Agreement, AgreementInputs, EvalSet, Run
from kiln.runtime.features import Prepared, one_per_input
from kiln.tasks.base import NO_LABEL, TaskSpec, sigmoid, softmax
from kiln.tasks.chunking import Chunking, as_chunking, by_owner, chunked
from kiln.tasks.files import field
from kiln.tasks.inputs import TextPair
from kiln.tasks.text_classification.export import TextClassificationExport


@dataclass(frozen=True)
class LabelScore:
    label: str
    score: float


@dataclass(frozen=True)
class ClassifyOptions:
    top_k: int | None = 1  # None: every label
    truncate: bool = True
    chunking: Chunking | None = None  # long texts as windows; their logits combined by max or mean


CHUNK_MODES = ("max", "mean")
COMBINE = {"max": np.max, "mean": np.mean}


def as_text_input(item: Any, index: int) -> str | TextPair:
    """A text or a pair; dicts use the transformers pipeline's keys ``text`` and ``text_pair``."""
    if isinstance(item, (str, TextPair)):
        return item
    if isinstance(item, Mapping) and set(item) == {"text", "text_pair"} \
            and all(isinstance(v, str) for v in item.values()):
        return TextPair(item["text"], item["text_pair"])
    if isinstance(item, Mapping) and set(item) == {"text"} and isinstance(item["text"], str):
        return item["text"]
    raise UsageError(f"text-classification inputs must be a string, {{'text': …, 'text_pair': …}} or "
                     f"kiln.TextPair (input {index} is {type(item).__name__} {str(item)[:60]!r})")


def score_function(config, num_labels: int):
    """The transformers pipeline's default: identity for regression, sigmoid for multi-label, else softmax."""
    if config.problem_type == "regression":
        return lambda x: x
    if config.problem_type == "multi_label_classification" or num_labels == 1:
        return sigmoid
    return softmax


class TextClassification(TaskSpec):
    export = TextClassificationExport
    decoders = True  # GPT-2 and GPT-Neo verified (sequence classification pools the last non-pad token)
    name = "text-classification"
    default_tolerance = 0.01
    tolerance_help = "top label agreement >= 1-t"
    metric = "accuracy"
    eval_fields = ("text", "label")

    live_figure = "label_agreement"  # the gate's figure, per input: the top label kept (1) or not (0)
    live_judged = "mean"

    def live_agreement(self, served: Any, reference: Any) -> float:
        a, b = np.asarray(served).reshape(-1), np.asarray(reference).reshape(-1)
        if a.size == 1:  # one logit: the label is its sign
            return float((a[0] > 0) == (b[0] > 0))
        return float(int(a.argmax()) == int(b.argmax()))

    def options(self, top_k: int | None = 1, truncate: bool = True, chunking: Any = None) -> ClassifyOptions:
        if top_k is not None and top_k < 1:
            raise UsageError(f"top_k must be at least 1, or None for every label (got {top_k})")
        return ClassifyOptions(top_k=top_k, truncate=truncate, chunking=as_chunking(chunking, CHUNK_MODES))

    def check_inputs(self, inputs: Sequence[Any]) -> list[Any]:
        return [as_text_input(item, i) for i, item in enumerate(inputs)]

    def prepare(self, inputs: Sequence[Any], encoder, options: ClassifyOptions) -> Prepared:
        if options.chunking is not None:
            return chunked(inputs, encoder, options.chunking)
        texts = [(x.text, x.text_pair) if isinstance(x, TextPair) else x for x in inputs]
        return one_per_input(inputs, encoder.encode(texts, truncate=options.truncate))

    def reduce(self, outputs: dict[str, np.ndarray], attention_mask: np.ndarray) -> list[np.ndarray]:
        return list(outputs["logits"].astype(np.float32))

    light_finalize = True

    def finalize(self, prepared: Prepared, reduced: Sequence[Any], options: ClassifyOptions,
                 encoder) -> list[list[LabelScore]]:
        results = []
        id2label = self.config.id2label
        if options.chunking is not None:  # one row of logits per input: the windows' combined
            combine = COMBINE[options.chunking.mode]
            reduced = [combine(np.stack(windows), axis=0) for windows in by_owner(prepared, reduced)]
        for logits in reduced:
            scores = score_function(self.config, logits.shape[-1])(logits)
            order = np.argsort(-scores, kind="stable")[: options.top_k]
            results.append([LabelScore(id2label.get(int(i), f"LABEL_{i}"), float(scores[i])) for i in order])
        return results

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
