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

from kiln.choices import TruncationSide, parse_choice
from kiln.errors import UsageError
from kiln.runtime.features import Prepared, one_per_input
from kiln.tasks.arrays import sigmoid, softmax
from kiln.tasks.base import TaskSpec
from kiln.tasks.chunking import Chunking, as_chunking, by_owner, chunked
from kiln.tasks.inputs import TextPair
from kiln.tasks.text_classification.export import TextClassificationExport
from kiln.tasks.text_classification.validation import TextClassificationValidation


@dataclass(frozen=True)
class LabelScore:
    label: str
    score: float


@dataclass(frozen=True)
class ClassifyOptions:
    top_k: int | None = 1  # None: every label
    truncate: bool = True
    chunking: Chunking | None = None  # long texts as windows; their logits combined by max or mean
    truncation_side: TruncationSide = TruncationSide.RIGHT  # which end an over-long input loses (TEI's direction)
    raw_scores: bool = False  # each label's logit instead of its probability (TEI's raw_scores)


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
    validation = TextClassificationValidation
    export = TextClassificationExport
    decoders = True  # GPT-2 and GPT-Neo verified (sequence classification pools the last non-pad token)
    name = "text-classification"


    def options(self, top_k: int | None = 1, truncate: bool = True, chunking: Any = None,
                truncation_side: str | TruncationSide = TruncationSide.RIGHT,
                raw_scores: bool = False) -> ClassifyOptions:
        """``truncation_side``: which end of an over-long input is cut (a pair: its longer text, at that end);
        ``raw_scores``: each label's logit, ranked the same, instead of its probability (softmax, or sigmoid for a
        multi-label model)."""
        side = parse_choice(TruncationSide, truncation_side, "truncation_side")
        if top_k is not None and top_k < 1:
            raise UsageError(f"top_k must be at least 1, or None for every label (got {top_k})")
        return ClassifyOptions(top_k=top_k, truncate=truncate, chunking=as_chunking(chunking, CHUNK_MODES),
                               truncation_side=side, raw_scores=raw_scores)

    def check_inputs(self, inputs: Sequence[Any]) -> list[Any]:
        return [as_text_input(item, i) for i, item in enumerate(inputs)]

    def prepare(self, inputs: Sequence[Any], encoder, options: ClassifyOptions) -> Prepared:
        if options.chunking is not None:
            return chunked(inputs, encoder, options.chunking)
        texts = [(x.text, x.text_pair) if isinstance(x, TextPair) else x for x in inputs]
        return one_per_input(inputs, encoder.encode(texts, truncate=options.truncate, side=options.truncation_side))

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
            scores = logits if options.raw_scores else score_function(self.config, logits.shape[-1])(logits)
            order = np.argsort(-scores, kind="stable")[: options.top_k]
            results.append([LabelScore(id2label.get(int(i), f"LABEL_{i}"), float(scores[i])) for i in order])
        return results

