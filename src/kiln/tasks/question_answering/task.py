"""Extractive QA: doc-stride windows, n-best span search, SQuAD-2 null answer, text cut by offsets.

Agreement: answer F1 against the original's answers (gate: >= 1 - t). Task metric: SQuAD v1.1/v2.0 exact
match and F1 (eval files: JSONL/CSV rows of question, context, answers; or SQuAD JSON). Route: POST /answer.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from kiln.data.texts import builtin_sentences, joined
from kiln.errors import UsageError
from kiln.records.figures import Agreement, AgreementInputs, EvalSet, Run
from kiln.runtime.features import Prepared
from kiln.scoring import squad_scores
from kiln.tasks.base import NO_LABEL, TaskSpec, softmax, valid_rows
from kiln.tasks.files import field
from kiln.tasks.inputs import QAInput
from kiln.tasks.question_answering.export import QuestionAnsweringExport


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


def builtin_questions(count: int, seed: int = 0) -> list[QAInput]:
    """Questions are built-in sentences; contexts are paragraphs of 1-8 other sentences."""
    n = len(builtin_sentences())
    return [QAInput(builtin_sentences()[(seed + 7 * i) % n], joined(seed + 11 * i + 3, 1 + (i % 8)))
            for i in range(count)]


class QuestionAnswering(TaskSpec):
    export = QuestionAnsweringExport
    name = "question-answering"
    default_tolerance = 0.02
    tolerance_help = "answer F1 against the original's answers >= 1-t"
    metric = "f1"
    eval_fields = ("question", "context", "answers")
    eval_formats = (".jsonl", ".csv", "SQuAD .json")

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
    def agreement_inputs(cls, encoder, count: int = 128) -> list[Any]:
        return builtin_questions(count // 4, seed=1)

    @classmethod
    def calibration_inputs(cls, encoder, count: int = 128) -> list[Any]:
        return builtin_questions(count // 4, seed=5)

    @classmethod
    def timing_inputs(cls, encoder, count: int = 256) -> list[Any]:
        return builtin_questions(count // 4, seed=9)

    @classmethod
    def inputs_from_lines(cls, lines: list[str], flag: str) -> list[Any]:
        raise UsageError(f"{flag} for question-answering needs .jsonl/.csv rows with question and context")

    @classmethod
    def sample_input(cls, text: str) -> Any:
        return QAInput("What is this about?", text)

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


def _answer_list(value: Any) -> list[str]:
    if isinstance(value, list):
        return [str(v) for v in value]
    if isinstance(value, str):
        return [value] if value else []
    raise TypeError("expected a list of answer strings")
