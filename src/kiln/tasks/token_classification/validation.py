"""token-classification's validation part: tags kept per token; entity F1 (seqeval's rules) as the task metric."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from kiln.choices import Aggregation
from kiln.errors import UsageError
from kiln.records.figures import Agreement, AgreementInputs, EvalSet, Run
from kiln.tasks.files import field
from kiln.tasks.validation import NO_LABEL, TaskValidation

if TYPE_CHECKING:
    from kiln.runtime.features import Prepared


def _word_list(value: Any) -> list[str]:
    """Tokens/tags: a JSON list, or a space-separated string (CSV)."""
    if isinstance(value, list):
        return [str(v) for v in value]
    if isinstance(value, str):
        return value.split()
    raise TypeError("expected a list or a space-separated string")


def _word_tags(predictor, sentences: Sequence[Sequence[str]]) -> list[list[str]]:
    """Per-word tags: the tag of each word's first sub-token (words joined by single spaces)."""
    texts = [" ".join(tokens) for tokens in sentences]
    results = predictor.predict(texts, aggregation=Aggregation.NONE, ignore_labels=())
    out = []
    for tokens, entities in zip(sentences, results):
        by_start: dict[int, str] = {}
        for entity in entities:
            by_start.setdefault(entity.start, entity.label)
        starts = np.cumsum([0] + [len(t) + 1 for t in tokens[:-1]])
        out.append([by_start.get(int(s), "O") for s in starts])
    return out


class TokenClassificationValidation(TaskValidation):
    name = "token-classification"
    default_tolerance = 0.01
    tolerance_help = "tag agreement per token >= 1-t"
    metric = "f1"
    eval_fields = ("tokens", "tags")

    @classmethod
    def agreement(cls, data: AgreementInputs, variant: Run) -> Agreement:
        per_item, total, same = [], 0, 0
        for enc, ref, got in zip(data.prepared.encodings, data.reference.reduced, variant.reduced):
            real = ~np.array(enc.special_tokens_mask, dtype=bool)
            equal = ref.argmax(-1)[real] == got.argmax(-1)[real]
            total, same = total + int(real.sum()), same + int(equal.sum())
            per_item.append(float(equal.mean()) if equal.size else 1.0)
        figures = {"tag_agreement": same / total if total else 1.0}
        return Agreement.of("tag_agreement", figures, data.lengths(), np.array(per_item), "agreement")

    @classmethod
    def parse_row(cls, row: Mapping[str, Any], where: str) -> tuple[Any, Any]:
        tokens, tags = field(row, "tokens", where, _word_list), field(row, "tags", where, _word_list)
        if len(tokens) != len(tags):

            raise UsageError(f"{where}: {len(tokens)} tokens but {len(tags)} tags")
        return tuple(tokens), tuple(tags)

    @classmethod
    def training_rows(cls, data: EvalSet) -> tuple[list[Any], list[Any]]:
        """Words joined by single spaces (as the task metric runs them), and their tags."""
        return cls.eval_inputs(data), list(data.labels)

    @classmethod
    def training_labels(cls, prepared: Prepared, labels: Sequence[Any], config, encoder) -> dict[str, list[np.ndarray]]:
        """Each word's tag on its first sub-token; later sub-tokens, special tokens and unlabelled rows: none."""
        by_name = {name: i for i, name in config.id2label.items()}
        rows = []
        for owner, encoding in zip(prepared.owners, prepared.encodings):
            row = np.full(len(encoding.ids), NO_LABEL, dtype=np.int64)
            tags = labels[owner]
            if tags is not None:
                words = prepared.inputs[owner].split(" ")
                first = {int(start): i for i, start in enumerate(np.cumsum([0] + [len(w) + 1 for w in words[:-1]]))}
                for t, (special, (start, _)) in enumerate(zip(encoding.special_tokens_mask, encoding.offsets)):
                    if not special and start in first:
                        tag = tags[first.pop(start)]
                        if tag not in by_name:
                            raise UsageError(f"train row {owner + 1}: tag {tag!r} is not one of the model's "
                                             f"labels: {', '.join(by_name)}")
                        row[t] = by_name[tag]
            rows.append(row)
        return {"logits": rows}

    @classmethod
    def evaluate(cls, predictor, data: EvalSet) -> dict[str, float]:
        """Entity-level precision/recall/F1 by seqeval (conlleval rules: an I- without a B- opens an entity)."""
        from seqeval.metrics import f1_score, precision_score, recall_score

        gold = [list(tags) for tags in data.labels]
        predicted = _word_tags(predictor, data.inputs)
        return {"precision": float(precision_score(gold, predicted)), "recall": float(recall_score(gold, predicted)),
                "f1": float(f1_score(gold, predicted))}

    @classmethod
    def eval_inputs(cls, data: EvalSet) -> list[Any]:
        return [" ".join(tokens) for tokens in data.inputs]

    live_figure = "tag_agreement"  # the gate's figure, per input: the share of its tokens whose tag is kept
    live_judged = "mean"

    @classmethod
    def live_agreement(cls, handler: Any, served: np.ndarray, reference: np.ndarray) -> float:
        a, b = np.asarray(served), np.asarray(reference)
        return float(np.mean(a.argmax(-1) == b.argmax(-1))) if a.size else 1.0
