"""The inputs optimize works on: agreement set, calibration set, timing mix, built-in STS evaluation."""

from __future__ import annotations

import json
from importlib import resources
from pathlib import Path
from typing import Any

from kiln.choices import TaskName
from kiln.errors import UsageError
from kiln.tasks.question_answering import QAInput
from kiln.texts import builtin_sentences, joined, length_mix
from kiln.tokenization import TextEncoder
from kiln.validation.evalsets import EvalSet, load_eval_set


def _token_counter(encoder: TextEncoder):
    return lambda text: len(encoder.encode([text], truncate=False)[0].ids)


def builtin_questions(count: int, seed: int = 0) -> list[QAInput]:
    """Questions are built-in sentences; contexts are paragraphs of 1-8 other sentences."""
    n = len(builtin_sentences())
    return [QAInput(builtin_sentences()[(seed + 7 * i) % n], joined(seed + 11 * i + 3, 1 + (i % 8)))
            for i in range(count)]


def agreement_inputs(task: TaskName, encoder: TextEncoder, count: int = 128) -> list[Any]:
    """Built-in inputs the variants are compared on: every built-in sentence plus lengths up to the maximum."""
    if task is TaskName.QUESTION_ANSWERING:
        return builtin_questions(count // 4, seed=1)
    extra = length_mix(max(0, count - len(builtin_sentences())), 10, encoder.max_length, seed=2,
                       token_count=_token_counter(encoder))
    return [*builtin_sentences(), *extra]


def calibration_inputs(task: TaskName, encoder: TextEncoder, path: Path | None, count: int = 128) -> list[Any]:
    """The user's calibration texts (.txt one per line, or an eval-style .jsonl/.csv), else built-in ones."""
    if path is not None:
        return read_texts(path, task)
    if task is TaskName.QUESTION_ANSWERING:
        return builtin_questions(count // 4, seed=5)
    return length_mix(count, 10, encoder.max_length, seed=1, token_count=_token_counter(encoder))


def timing_inputs(task: TaskName, encoder: TextEncoder, user: list[Any] | None, count: int = 256) -> list[Any]:
    """The realistic mix variants are timed on: the user's texts when given, else 10-200 tokens uniform."""
    if user:
        return user
    if task is TaskName.QUESTION_ANSWERING:
        return builtin_questions(count // 4, seed=9)
    return length_mix(count, 10, min(200, encoder.max_length), seed=3, token_count=_token_counter(encoder))


def read_texts(path: Path, task: TaskName) -> list[Any]:
    path = path.expanduser()
    if not path.is_file():
        raise UsageError(f"--calibration file {path} does not exist")
    if path.suffix.lower() == ".txt":
        if task is TaskName.QUESTION_ANSWERING:
            raise UsageError("--calibration for question-answering needs .jsonl/.csv with question and context")
        texts = [line.strip() for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    else:
        data = load_eval_set(path, task)
        texts = data.texts or [t for pair in data.pairs for t in pair] or [" ".join(t) for t in data.tokens] \
            or data.questions
    if not texts:
        raise UsageError(f"--calibration file {path} has no texts")
    return texts


def builtin_sts() -> EvalSet:
    """kiln's own STS pairs (0-5 similarity, written for kiln), the default feature-extraction task metric."""
    out = EvalSet(TaskName.FEATURE_EXTRACTION, "built-in STS pairs")
    text = resources.files("kiln.data").joinpath("sts.jsonl").read_text(encoding="utf-8")
    for line in text.splitlines():
        row = json.loads(line)
        out.pairs.append((row["sentence1"], row["sentence2"]))
        out.scores.append(float(row["score"]))
    return out


def eval_set(task: TaskName, path: Path | None) -> EvalSet | None:
    if path is not None:
        return load_eval_set(path, task)
    return builtin_sts() if task is TaskName.FEATURE_EXTRACTION else None


def eval_texts(data: EvalSet | None) -> list[Any] | None:
    if data is None or data.source.startswith("built-in"):
        return None
    return data.texts or [a for a, _ in data.pairs] or [" ".join(t) for t in data.tokens] or data.questions
