"""A kiln artifact in users' transformers code: hf_model in transformers.pipeline, and kiln.pipeline (QA too)."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
import transformers

import kiln
from kiln.choices import Aggregation
from kiln.data.texts import builtin_pairs, builtin_sentences, joined
from kiln.errors import UsageError
from kiln.source.loading import load_source
from kiln.source.reference import reference_predictor
from kiln.tasks import QAInput, TaskName

TEXTS = [builtin_sentences()[i] for i in (0, 5, 9)] + ["Anna Schmidt works for Acme Corporation in Berlin."]


def _torch_pipeline(task, tiny_model):
    model_dir = str(tiny_model("bert", task))
    return transformers.pipeline(task.value, model=model_dir, tokenizer=model_dir)


def test_feature_extraction_pipeline(task_artifacts, tiny_model):
    ours = kiln.pipeline("feature-extraction", task_artifacts[TaskName.FEATURE_EXTRACTION])
    want = _torch_pipeline(TaskName.FEATURE_EXTRACTION, tiny_model)(TEXTS)
    got = ours(TEXTS)
    assert type(ours.model).__name__ == "KilnModel"  # the ONNX variant underneath, not a torch model
    for w, g in zip(want, got):
        np.testing.assert_allclose(np.array(g), np.array(w), atol=1e-4)


def test_text_classification_pipeline_with_pairs(task_artifacts, tiny_model):
    model = kiln.hf_model(task_artifacts[TaskName.TEXT_CLASSIFICATION])
    ours = transformers.pipeline("text-classification", model=model,
                                 tokenizer=kiln.hf_tokenizer(task_artifacts[TaskName.TEXT_CLASSIFICATION]))
    torch_pipe = _torch_pipeline(TaskName.TEXT_CLASSIFICATION, tiny_model)
    inputs = TEXTS + [{"text": a, "text_pair": b} for a, b in builtin_pairs(4)]
    for w, g in zip(torch_pipe(inputs, top_k=None, truncation=True), ours(inputs, top_k=None, truncation=True)):
        assert [x["label"] for x in g] == [x["label"] for x in w]
        np.testing.assert_allclose([x["score"] for x in g], [x["score"] for x in w], atol=1e-5)


@pytest.mark.parametrize("strategy", [a.value for a in Aggregation])
def test_token_classification_pipeline(task_artifacts, tiny_model, strategy):
    ours = kiln.pipeline("token-classification", task_artifacts[TaskName.TOKEN_CLASSIFICATION],
                         aggregation_strategy=strategy, ignore_labels=[])
    want = _torch_pipeline(TaskName.TOKEN_CLASSIFICATION, tiny_model)(TEXTS, aggregation_strategy=strategy,
                                                                     ignore_labels=[])
    got = ours(TEXTS)
    for w, g in zip(want, got):
        key = "entity" if strategy == "none" else "entity_group"
        assert [(e[key], e["start"], e["end"], e["word"]) for e in g] == \
            [(e[key], e["start"], e["end"], e["word"]) for e in w]
        np.testing.assert_allclose([e["score"] for e in g], [e["score"] for e in w], atol=1e-4)


def test_question_answering_pipeline_has_transformers_4s_call(task_artifacts, tiny_model):
    qa = kiln.pipeline("question-answering", task_artifacts[TaskName.QUESTION_ANSWERING])
    reference = reference_predictor(load_source(str(tiny_model("bert", TaskName.QUESTION_ANSWERING)),
                                                TaskName.QUESTION_ANSWERING))
    question, context = builtin_sentences()[2], joined(6, 5)  # several doc-stride windows at 128 tokens
    one = qa(question=question, context=context, doc_stride=32)
    assert set(one) == {"score", "start", "end", "answer"} and context[one["start"]:one["end"]] == one["answer"]
    want = reference.predict([QAInput(question, context)], top_k=3, doc_stride=32)[0]
    top = qa({"question": question, "context": context}, top_k=3, doc_stride=32)
    assert [a["answer"] for a in top] == [a.answer for a in want]
    np.testing.assert_allclose([a["score"] for a in top], [a.score for a in want], atol=1e-4)
    batch = qa([{"question": question, "context": context}] * 2, doc_stride=32)
    assert batch == [one, one]
    null = qa(question=question, context=context, handle_impossible_answer=True, max_answer_len=3, doc_stride=32)
    assert null["answer"] == context[null["start"]:null["end"]]
    with pytest.raises(UsageError, match="needs both question= and context="):
        qa(question=question)


def test_a_pipeline_for_another_task_is_refused(task_artifacts):
    with pytest.raises(UsageError, match="is a feature-extraction artifact; asked for a text-classification"):
        kiln.pipeline("text-classification", task_artifacts[TaskName.FEATURE_EXTRACTION])


def test_import_kiln_stays_free_of_torch_and_transformers():
    code = ("import sys, kiln; assert 'torch' not in sys.modules and 'transformers' not in sys.modules, "
            "sorted(m for m in sys.modules if m.startswith(('torch', 'transformers')))[:5]; "
            "assert callable(kiln.hf_model) and 'torch' in sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


def test_a_refused_command_is_refused_before_torch_loads(tmp_path):
    """A missing model directory, an existing output and distill's missing data are refused before torch and
    transformers are imported (~4 s of CPU a process): the same errors, a second after the command starts."""
    taken = tmp_path / "taken"
    taken.mkdir()
    code = f"""
import sys
import kiln
from kiln.errors import KilnError
calls = [lambda: kiln.export("./no-such-model", output={str(tmp_path / 'o')!r}),
         lambda: kiln.optimize({str(tmp_path)!r}, output={str(taken)!r}),
         lambda: kiln.distill({str(tmp_path)!r}, output={str(tmp_path / 's')!r}, layers=1)]
for call in calls:
    try:
        call()
    except KilnError as err:
        print(type(err).__name__, err)
    else:
        raise SystemExit("not refused")
loaded = sorted(m for m in sys.modules if m.split(".")[0] in ("torch", "transformers"))
assert not loaded, loaded[:5]
"""
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr[-2000:]
    lines = run.stdout.splitlines()
    assert "model directory ./no-such-model does not exist" in lines[0]
    assert f"{taken} already exists; pass --force" in lines[1]
    assert "kiln distill needs data" in lines[2]
