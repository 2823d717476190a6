"""Extractive QA: doc-stride windows, n-best span search, SQuAD-2 null answer, text cut by offsets.

Agreement: answer F1 against the original's answers (gate: >= 1 - t). Task metric: SQuAD v1.1/v2.0 exact
match and F1 (eval files: JSONL/CSV rows of question, context, answers; or SQuAD JSON). Route: POST /answer.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from kiln.errors import UsageError
from kiln.runtime.features import Prepared
from kiln.tasks.arrays import softmax, valid_rows
from kiln.tasks.base import TaskSpec
from kiln.tasks.inputs import QAInput
from kiln.tasks.question_answering.export import QuestionAnsweringExport
from kiln.tasks.question_answering.validation import QuestionAnsweringValidation


@dataclass(frozen=True)
class Answer:
    answer: str
    score: float
    start: int
    end: int


@dataclass(frozen=True)
class AnswerOptions:
    top_k: int = 1
    max_answer_len: int = 15
    max_seq_len: int | None = None  # default: min(model maximum, 384)
    doc_stride: int | None = None  # default: min(max_seq_len // 2, 128)
    allow_null: bool = False  # SQuAD 2.0: "no answer" competes with the best span
    null_threshold: float = 0.0  # answer "" only when null score > best span score + threshold
    truncate: bool = True  # accepted for a uniform call; windows cover the whole context, nothing is cut


def as_qa_input(item: Any, index: int = 0) -> QAInput:
    if isinstance(item, QAInput):
        return item
    if isinstance(item, Mapping) and set(item) == {"question", "context"} \
            and all(isinstance(v, str) for v in item.values()):
        return QAInput(item["question"], item["context"])
    if isinstance(item, (tuple, list)) and len(item) == 2 and all(isinstance(v, str) for v in item):
        return QAInput(item[0], item[1])
    raise UsageError(f"question-answering inputs must be {{'question': …, 'context': …}}, (question, context) or "
                     f"kiln.QAInput (input {index} is {type(item).__name__} {str(item)[:60]!r})")


class QuestionAnswering(TaskSpec):
    validation = QuestionAnsweringValidation
    export = QuestionAnsweringExport
    name = "question-answering"

    def options(self, **kwargs: Any) -> AnswerOptions:
        options = AnswerOptions(**kwargs)
        if options.top_k < 1 or options.max_answer_len < 1:
            raise UsageError(f"top_k and max_answer_len must be at least 1 (got {options.top_k}, "
                             f"{options.max_answer_len})")
        return options

    def window(self, options: AnswerOptions) -> tuple[int, int]:
        max_len = min(options.max_seq_len or 384, self.config.max_length)
        stride = options.doc_stride if options.doc_stride is not None else min(max_len // 2, 128)
        if not 0 <= stride < max_len:
            raise UsageError(f"doc_stride must be between 0 and max_seq_len ({max_len}) (got {stride})")
        return max_len, stride

    def check_inputs(self, inputs: Sequence[Any]) -> list[Any]:
        return [as_qa_input(item, i) for i, item in enumerate(inputs)]

    def prepare(self, inputs: Sequence[Any], encoder, options: AnswerOptions) -> Prepared:
        max_len, stride = self.window(options)
        pairs = [as_qa_input(x, i) for i, x in enumerate(inputs)]
        encodings, owners = [], []
        for i, pair in enumerate(pairs):
            windows = encoder.encode_windows(pair.question, pair.context, max_length=max_len, stride=stride)
            encodings.extend(windows)
            owners.extend([i] * len(windows))
        return Prepared(tuple(pairs), tuple(encodings), tuple(owners), (False,) * len(pairs))

    def reduce(self, outputs: dict[str, np.ndarray], attention_mask: np.ndarray) -> list[tuple[np.ndarray, ...]]:
        starts = valid_rows(outputs["start_logits"].astype(np.float32), attention_mask)
        ends = valid_rows(outputs["end_logits"].astype(np.float32), attention_mask)
        return list(zip(starts, ends))

    def comparable(self, reduced: tuple[np.ndarray, np.ndarray]) -> np.ndarray:
        return np.concatenate(reduced)

    @classmethod
    def inputs_from_lines(cls, lines: list[str], flag: str) -> list[Any]:
        raise UsageError(f"{flag} for question-answering needs .jsonl/.csv rows with question and context")

    @classmethod
    def sample_input(cls, text: str) -> Any:
        return QAInput("What is this about?", text)

    def finalize(self, prepared: Prepared, reduced: Sequence[Any], options: AnswerOptions,
                 encoder) -> list[list[Answer]]:
        per_input: list[list[Answer]] = [[] for _ in prepared.inputs]
        null_scores = [1.0] * len(prepared.inputs)
        for owner, encoding, (start_logits, end_logits) in zip(prepared.owners, prepared.encodings, reduced):
            context = prepared.inputs[owner].context
            answers, null = _window_answers(encoding, start_logits, end_logits, context, options)
            per_input[owner].extend(answers)
            null_scores[owner] = min(null_scores[owner], null)
        results = []
        for answers, null in zip(per_input, null_scores):
            answers.sort(key=lambda a: a.score, reverse=True)
            if options.allow_null and (not answers or null > answers[0].score + options.null_threshold):
                answers.insert(0, Answer("", null, 0, 0))
            results.append(answers[: options.top_k])
        return results


def _window_answers(
    encoding: Any, start_logits: np.ndarray, end_logits: np.ndarray, context: str, options: AnswerOptions
) -> tuple[list[Answer], float]:
    """Best spans of one window, and its null score (probability mass on the first token)."""
    in_context = np.array([s == 1 for s in encoding.sequence_ids])
    allowed = in_context.copy()
    allowed[0] = True  # the first token ([CLS]/<s>) carries the no-answer score
    start = softmax(np.where(allowed, start_logits, -10000.0))
    end = softmax(np.where(allowed, end_logits, -10000.0))
    null = float(start[0] * end[0])
    start[0] = end[0] = 0.0
    # Score every span (i, j) with i <= j < i + max_answer_len; keep the k best inside the context.
    spans = np.tril(np.triu(np.outer(start, end)), options.max_answer_len - 1)
    flat = spans.ravel()
    k = min(options.top_k, flat.size)
    best = np.argpartition(-flat, k - 1)[:k] if k < flat.size else np.arange(flat.size)
    best = best[np.argsort(-flat[best], kind="stable")]
    answers = []
    for s, e in zip(*np.unravel_index(best, spans.shape)):
        if in_context[s] and in_context[e] and spans[s, e] > 0:
            char_start, char_end = encoding.offsets[s][0], encoding.offsets[e][1]
            answers.append(Answer(context[char_start:char_end], float(spans[s, e]), char_start, char_end))
    return answers, null


