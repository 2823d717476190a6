"""Token tagging (NER): word-piece aggregation into entities, as the transformers pipeline does it.

Agreement: the same tag as the original per token (gate: >= 1 - t). Task metric: entity-level F1 from
seqeval (what users compare against), on eval rows of ``tokens`` and ``tags``. Route: POST /tokens.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from tokenizers import Encoding, Tokenizer

from kiln.choices import Aggregation, parse_choice
from kiln.runtime.features import Prepared
from kiln.tasks.arrays import softmax, valid_rows
from kiln.tasks.base import TaskSpec
from kiln.tasks.token_classification.export import TokenClassificationExport
from kiln.tasks.token_classification.validation import TokenClassificationValidation


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
    validation = TokenClassificationValidation
    export = TokenClassificationExport
    name = "token-classification"

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

    def finalize(
        self, prepared: Prepared, reduced: Sequence[Any], options: TagOptions, encoder,
    ) -> list[list[Entity]]:
        results = []
        for text, encoding, logits in zip(prepared.inputs, prepared.encodings, reduced):
            tokens = self._gather(text, encoding, softmax(logits), encoder.tokenizer, options.aggregation)
            entities = self._aggregate(tokens, options.aggregation, encoder.tokenizer)
            results.append([e for e in entities if e.label not in options.ignore_labels])
        return results


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


