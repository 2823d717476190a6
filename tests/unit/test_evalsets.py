"""Evaluation files: JSONL, CSV and SQuAD JSON per task, with errors that name the line."""

from __future__ import annotations

import json

import pytest

from kiln.errors import UsageError
from kiln.tasks import TaskName
from kiln.validation.evalsets import load_eval_set


def _write(path, rows):
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    return path


def test_jsonl_per_task(tmp_path):
    sts = load_eval_set(_write(tmp_path / "sts.jsonl", [{"sentence1": "a", "sentence2": "b", "score": 3}]),
                        TaskName.FEATURE_EXTRACTION)
    assert sts.inputs == (("a", "b"),) and sts.labels == (3.0,)
    cls = load_eval_set(_write(tmp_path / "c.jsonl", [{"text": "good", "label": "positive"}]),
                        TaskName.TEXT_CLASSIFICATION)
    assert cls.inputs == ("good",) and cls.labels == ("positive",)
    ner = load_eval_set(_write(tmp_path / "n.jsonl", [{"tokens": ["Anna", "lives"], "tags": ["B-PER", "O"]}]),
                        TaskName.TOKEN_CLASSIFICATION)
    assert ner.inputs == (("Anna", "lives"),) and ner.labels == (("B-PER", "O"),)
    qa = load_eval_set(_write(tmp_path / "q.jsonl", [{"question": "q", "context": "c", "answers": ["c"]},
                                                      {"question": "q2", "context": "c", "answers": []}]),
                       TaskName.QUESTION_ANSWERING)
    assert qa.labels == (("c",), ())


def test_csv(tmp_path):
    path = tmp_path / "c.csv"
    path.write_text('text,label\n"hello, world",positive\nbad,negative\n')
    data = load_eval_set(path, TaskName.TEXT_CLASSIFICATION)
    assert data.inputs == ("hello, world", "bad")
    tags = tmp_path / "t.csv"
    tags.write_text("tokens,tags\nAnna lives here,B-PER O O\n")
    assert load_eval_set(tags, TaskName.TOKEN_CLASSIFICATION).labels == (("B-PER", "O", "O"),)


def test_sentence_pairs_in_glue_and_pipeline_spelling(tmp_path):
    from kiln.tasks import TextPair

    glue = tmp_path / "mrpc.csv"
    glue.write_text("sentence1,sentence2,label\nA cat sat.,The cat was sitting.,1\n")
    assert load_eval_set(glue, TaskName.TEXT_CLASSIFICATION).inputs == (TextPair("A cat sat.", "The cat was sitting."),)
    rows = _write(tmp_path / "p.jsonl", [{"text": "a", "text_pair": "b", "label": "0"}, {"text": "c", "label": "1"}])
    assert load_eval_set(rows, TaskName.TEXT_CLASSIFICATION).inputs == (TextPair("a", "b"), "c")


def test_squad_json(tmp_path):
    path = tmp_path / "dev.json"
    path.write_text(json.dumps({"data": [{"paragraphs": [{"context": "Paris is in France.", "qas": [
        {"question": "Where is Paris?", "answers": [{"text": "France", "answer_start": 12}]},
        {"question": "Where is Rome?", "answers": [], "is_impossible": True}]}]}]}))
    data = load_eval_set(path, TaskName.QUESTION_ANSWERING)
    assert [q.question for q in data.inputs] == ["Where is Paris?", "Where is Rome?"]
    assert data.labels == (("France",), ())


@pytest.mark.parametrize(("content", "task", "message"), [
    ('{"text": "a", "label": "x"}\n{"text": "b"\n', TaskName.TEXT_CLASSIFICATION, r"line 2: not valid JSON"),
    ('{"text": "a", "label": "x"}\n{"text": "b"}\n', TaskName.TEXT_CLASSIFICATION, r"line 2: missing field 'label'"),
    ('{"sentence1": "a", "sentence2": "b", "score": "high"}\n', TaskName.FEATURE_EXTRACTION,
     r"line 1: field 'score' has a bad value 'high'"),
    ('{"tokens": ["a", "b"], "tags": ["O"]}\n', TaskName.TOKEN_CLASSIFICATION, r"line 1: 2 tokens but 1 tags"),
    ('[1, 2]\n', TaskName.TEXT_CLASSIFICATION, r"line 1: expected a JSON object"),
])
def test_malformed_jsonl_names_the_line(tmp_path, content, task, message):
    path = tmp_path / "bad.jsonl"
    path.write_text(content)
    with pytest.raises(UsageError, match=message):
        load_eval_set(path, task)


def test_malformed_csv_and_formats(tmp_path):
    path = tmp_path / "bad.csv"
    path.write_text("text,label\nfine,pos\ntoo,many,values\n")
    with pytest.raises(UsageError, match=r"line 3: more values than columns"):
        load_eval_set(path, TaskName.TEXT_CLASSIFICATION)
    other = tmp_path / "data.parquet"
    other.write_text("")
    with pytest.raises(UsageError, match=r"unsupported format .parquet for text-classification \(use .jsonl, .csv"):
        load_eval_set(other, TaskName.TEXT_CLASSIFICATION)
    with pytest.raises(UsageError, match="does not exist"):
        load_eval_set(tmp_path / "missing.jsonl", TaskName.TEXT_CLASSIFICATION)
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n")
    with pytest.raises(UsageError, match="has no examples"):
        load_eval_set(empty, TaskName.TEXT_CLASSIFICATION)
