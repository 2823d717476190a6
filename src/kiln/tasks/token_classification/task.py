"""Token tagging (NER): word-piece aggregation into entities, as the transformers pipeline does it.

Agreement: the same tag as the original per token (gate: >= 1 - t). Task metric: entity-level F1 from
seqeval (what users compare against), on eval rows of ``tokens`` and ``tags``. Route: POST /tokens.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from tokenizers import Encoding, Tokenizer

from kiln.choices import Aggregation, parse_choice
from kiln.errors import UsageError
from kiln.records.figures import Agreement, AgreementInputs, EvalSet, Run
from kiln.runtime.features import Prepared
from kiln.tasks.base import NO_LABEL, TaskSpec, softmax, valid_rows
from kiln.tasks.files import field
from kiln.tasks.token_classification.export import TokenClassificationExport


@dataclass(frozen=True)
class Entity:
    """One tagged token (aggregation none) or one grouped entity (every other strategy)."""

    label: str
    score: float
    word: str
    start: int
    end: int
    index: int | None = None  # token position, only without aggregation


@dataclass(frozen=True)
class TagOptions:
    aggregation: Aggregation = Aggregation.SIMPLE
    ignore_labels: tuple[str, ...] = ("O",)
    truncate: bool = True


@dataclass
class _Token:
    word: str
    scores: np.ndarray
    start: int
    end: int
    index: int
    is_subword: bool


class TokenClassification(TaskSpec):
    export = TokenClassificationExport
    name = "token-classification"
    default_tolerance = 0.01
    tolerance_help = "tag agreement per token >= 1-t"
    metric = "f1"
    eval_fields = ("tokens", "tags")

    def __init__(self, config) -> None:
        super().__init__(config)
        self._id2label = config.id2label

    def options(
        self, aggregation: Aggregation | str = Aggregation.SIMPLE, ignore_labels: Sequence[str] = ("O",),
        truncate: bool = True,
    ) -> TagOptions:
        strategy = parse_choice(Aggregation, aggregation, "aggregation") if isinstance(aggregation, str) \
            else aggregation
        return TagOptions(aggregation=strategy, ignore_labels=tuple(ignore_labels), truncate=truncate)

    def reduce(self, outputs: dict[str, np.ndarray], attention_mask: np.ndarray) -> list[np.ndarray]:
        return valid_rows(outputs["logits"].astype(np.float32), attention_mask)

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

    def finalize(
        self, prepared: Prepared, reduced: Sequence[Any], options: TagOptions, encoder,
    ) -> list[list[Entity]]:
        results = []
        for text, encoding, logits in zip(prepared.inputs, prepared.encodings, reduced):
            tokens = self._gather(text, encoding, softmax(logits), encoder.tokenizer, options.aggregation)
            entities = self._aggregate(tokens, options.aggregation, encoder.tokenizer)
            results.append([e for e in entities if e.label not in options.ignore_labels])
        return results

    live_figure = "tag_agreement"  # the gate's figure, per input: the share of its tokens whose tag is kept
    live_judged = "mean"

    def live_agreement(self, served: np.ndarray, reference: np.ndarray) -> float:
        a, b = np.asarray(served), np.asarray(reference)
        return float(np.mean(a.argmax(-1) == b.argmax(-1))) if a.size else 1.0

    def comparable(self, reduced: np.ndarray) -> np.ndarray:
        return reduced.reshape(-1)

    def _gather(
        self, text: str, encoding: Encoding, scores: np.ndarray, tokenizer: Tokenizer, strategy: Aggregation
    ) -> list[_Token]:
        has_prefix = bool(getattr(tokenizer.model, "continuing_subword_prefix", None))
        unk = getattr(tokenizer.model, "unk_token", None)
        unk_id = tokenizer.token_to_id(unk) if isinstance(unk, str) else None
        tokens = []
        for idx, (token_id, (start, end), special) in enumerate(
            zip(encoding.ids, encoding.offsets, encoding.special_tokens_mask)
        ):
            if special:
                continue
            word = tokenizer.id_to_token(token_id) or ""
            word_ref = text[start:end]
            if has_prefix:
                is_subword = len(word) != len(word_ref)
            else:  # the pipeline's fallback heuristic for tokenizers without a subword prefix
                is_subword = start > 0 and " " not in text[start - 1 : start + 1]
            if token_id == unk_id:
                word, is_subword = word_ref, False
            tokens.append(_Token(word, scores[idx], start, end, idx, is_subword))
        return tokens

    def _aggregate(self, tokens: list[_Token], strategy: Aggregation, tokenizer: Tokenizer) -> list[Entity]:
        if strategy in (Aggregation.NONE, Aggregation.SIMPLE):
            entities = [self._entity([t], t.scores, t.word, index=t.index) for t in tokens]
            if strategy is Aggregation.NONE:
                return entities
        else:
            entities = [self._word_entity(group, strategy, tokenizer) for group in _words(tokens)]
        return [_group(run, tokenizer) for run in _runs(entities)]

    def _entity(self, tokens: list[_Token], scores: np.ndarray, word: str, index: int | None = None) -> Entity:
        best = int(scores.argmax())
        return Entity(self._id2label[best], float(scores[best]), word, tokens[0].start, tokens[-1].end, index)

    def _word_entity(self, group: list[_Token], strategy: Aggregation, tokenizer: Tokenizer) -> Entity:
        word = _decode(tokenizer, [t.word for t in group])
        if strategy is Aggregation.FIRST:
            scores = group[0].scores
        elif strategy is Aggregation.MAX:
            scores = max(group, key=lambda t: t.scores.max()).scores
        else:
            scores = np.nanmean(np.stack([t.scores for t in group]), axis=0)
        return self._entity(group, scores, word)


def _words(tokens: list[_Token]) -> list[list[_Token]]:
    groups: list[list[_Token]] = []
    for token in tokens:
        if groups and token.is_subword:
            groups[-1].append(token)
        else:
            groups.append([token])
    return groups


def _tag(label: str) -> tuple[str, str]:
    if label.startswith(("B-", "I-")):
        return label[0], label[2:]
    return "I", label


def _runs(entities: list[Entity]) -> list[list[Entity]]:
    """Adjacent entities with the same tag, where a B- starts a new run."""
    runs: list[list[Entity]] = []
    for entity in entities:
        bi, tag = _tag(entity.label)
        if runs and bi != "B" and _tag(runs[-1][-1].label)[1] == tag:
            runs[-1].append(entity)
        else:
            runs.append([entity])
    return runs


def _group(run: list[Entity], tokenizer: Tokenizer) -> Entity:
    return Entity(
        label=run[0].label.split("-", 1)[-1],
        score=float(np.nanmean([e.score for e in run])),
        word=_decode(tokenizer, [e.word for e in run]),
        start=run[0].start,
        end=run[-1].end,
    )


def _decode(tokenizer: Tokenizer, tokens: list[str]) -> str:
    return tokenizer.decoder.decode(tokens) if tokenizer.decoder is not None else " ".join(tokens)


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
