"""Labelled evaluation files per task (JSONL, CSV, SQuAD JSON), with errors that name the line."""

from __future__ import annotations

import csv
import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kiln.choices import TaskName
from kiln.errors import UsageError
from kiln.tasks.question_answering import QAInput


@dataclass
class EvalSet:
    """One task's labelled examples; which fields are filled depends on the task."""

    task: TaskName
    source: str
    texts: list[str] = field(default_factory=list)  # classification
    labels: list[str] = field(default_factory=list)  # classification
    pairs: list[tuple[str, str]] = field(default_factory=list)  # STS
    scores: list[float] = field(default_factory=list)  # STS
    tokens: list[list[str]] = field(default_factory=list)  # token classification
    tags: list[list[str]] = field(default_factory=list)  # token classification
    questions: list[QAInput] = field(default_factory=list)  # QA
    answers: list[list[str]] = field(default_factory=list)  # QA; empty list = no answer (SQuAD 2.0)

    def __len__(self) -> int:
        return max(len(self.labels), len(self.scores), len(self.tags), len(self.answers))


# Required fields per task, as JSONL keys / CSV columns.
FIELDS: dict[TaskName, tuple[str, ...]] = {
    TaskName.FEATURE_EXTRACTION: ("sentence1", "sentence2", "score"),
    TaskName.TEXT_CLASSIFICATION: ("text", "label"),
    TaskName.TOKEN_CLASSIFICATION: ("tokens", "tags"),
    TaskName.QUESTION_ANSWERING: ("question", "context", "answers"),
}


def _rows_jsonl(path: Path) -> Iterator[tuple[int, dict[str, Any]]]:
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as err:
            raise UsageError(f"{path} line {number}: not valid JSON ({err.msg})") from err
        if not isinstance(row, dict):
            raise UsageError(f"{path} line {number}: expected a JSON object, got {type(row).__name__}")
        yield number, row


def _rows_csv(path: Path) -> Iterator[tuple[int, dict[str, Any]]]:
    with path.open(newline="", encoding="utf-8") as fh:
        reader = csv.DictReader(fh)
        for row in reader:
            if None in row:
                raise UsageError(f"{path} line {reader.line_num}: more values than columns {reader.fieldnames}")
            yield reader.line_num, row


def _squad(path: Path) -> EvalSet:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))["data"]
    except (json.JSONDecodeError, KeyError, TypeError) as err:
        raise UsageError(f"{path}: not a SQuAD file (expected {{'data': [{{'paragraphs': …}}]}}): {err}") from err
    out = EvalSet(TaskName.QUESTION_ANSWERING, str(path))
    for article in data:
        for paragraph in article.get("paragraphs", []):
            for qa in paragraph.get("qas", []):
                impossible = qa.get("is_impossible", False)
                out.questions.append(QAInput(qa["question"], paragraph["context"]))
                out.answers.append([] if impossible else [a["text"] for a in qa.get("answers", [])])
    return out


def _field(row: dict[str, Any], name: str, where: str, parse: Callable[[Any], Any] = str) -> Any:
    if name not in row or row[name] in (None, ""):
        if name == "answers" and name in row:
            return parse(row[name])
        raise UsageError(f"{where}: missing field {name!r} (needed: {', '.join(sorted(row))})")
    try:
        return parse(row[name])
    except (TypeError, ValueError) as err:
        raise UsageError(f"{where}: field {name!r} has a bad value {row[name]!r} ({err})") from err


def _word_list(value: Any) -> list[str]:
    """Tokens/tags: a JSON list, or a space-separated string (CSV)."""
    if isinstance(value, list):
        return [str(v) for v in value]
    if isinstance(value, str):
        return value.split()
    raise TypeError("expected a list or a space-separated string")


def _answer_list(value: Any) -> list[str]:
    if isinstance(value, list):
        return [str(v) for v in value]
    if isinstance(value, str):
        return [value] if value else []
    raise TypeError("expected a list of answer strings")


def _add(out: EvalSet, row: dict[str, Any], where: str) -> None:
    if out.task is TaskName.FEATURE_EXTRACTION:
        out.pairs.append((_field(row, "sentence1", where), _field(row, "sentence2", where)))
        out.scores.append(_field(row, "score", where, float))
    elif out.task is TaskName.TEXT_CLASSIFICATION:
        out.texts.append(_field(row, "text", where))
        out.labels.append(_field(row, "label", where))
    elif out.task is TaskName.TOKEN_CLASSIFICATION:
        tokens, tags = _field(row, "tokens", where, _word_list), _field(row, "tags", where, _word_list)
        if len(tokens) != len(tags):
            raise UsageError(f"{where}: {len(tokens)} tokens but {len(tags)} tags")
        out.tokens.append(tokens)
        out.tags.append(tags)
    else:
        out.questions.append(QAInput(_field(row, "question", where), _field(row, "context", where)))
        out.answers.append(_field(row, "answers", where, _answer_list))


def load_eval_set(path: Path, task: TaskName) -> EvalSet:
    """Read ``path`` for ``task``: .jsonl and .csv with the task's fields, or SQuAD .json for QA."""
    path = path.expanduser()
    if not path.is_file():
        raise UsageError(f"--eval file {path} does not exist")
    suffix = path.suffix.lower()
    if suffix == ".json" and task is TaskName.QUESTION_ANSWERING:
        out = _squad(path)
    elif suffix in (".jsonl", ".csv"):
        out = EvalSet(task, str(path))
        rows = _rows_jsonl(path) if suffix == ".jsonl" else _rows_csv(path)
        for number, row in rows:
            _add(out, row, f"{path} line {number}")
    else:
        formats = ".jsonl, .csv" + (", SQuAD .json" if task is TaskName.QUESTION_ANSWERING else "")
        raise UsageError(f"--eval file {path}: unsupported format {suffix or '(none)'} for {task.value} "
                         f"(use {formats} with fields {', '.join(FIELDS[task])})")
    if not len(out):
        raise UsageError(f"--eval file {path} has no examples")
    return out
