"""The task-metric path on MiniLM heads fine-tuned over generated data (cached between runs).

The runs here judge each variant once (``sensitivity=False``): what is tested is the metric beside the agreement,
and the int8 searches have tests of their own. On an AMX Xeon openvino-int8-static missed the gate on the sentiment
head and its four SmoothQuant alternatives and a layer search took this test from ~1 to 6-8 minutes of the suite.
The classification run builds onnx-fp32 only: onnx-int8-dynamic was rejected there on label agreement (0.984 in
mixed batches) after ~30 s of checks, and that a rejected variant gets no metric is tested in
tests/integration/test_optimize.py; the question-answering run keeps both."""

from __future__ import annotations

import pytest

from kiln.optimizing.job import OptimizeConfig, OptimizeJob
from kiln.source.loading import load_source
from kiln.source.reference import reference_predictor
from kiln.tasks import TaskName, task_spec
from kiln.testing import finetune
from kiln.validation.evalsets import load_eval_set

pytestmark = pytest.mark.slow


def test_classification_metric_through_optimize(tmp_path):
    # Reviews of one sentence: read up to 128 tokens, so the agreement set (which reaches the model's maximum
    # length) checks lengths the head was made for, not 512 (3/4 of this test's time; long inputs are the bundled
    # MiniLM's runs elsewhere).
    model = finetune.sentiment_model(max_length=128)
    eval_file = finetune.write_jsonl(finetune.sentiment_examples(200, seed=99), tmp_path / "eval.jsonl")
    reference = task_spec("text-classification").validation.evaluate(
        reference_predictor(load_source(str(model), TaskName.TEXT_CLASSIFICATION)),
                         load_eval_set(eval_file, TaskName.TEXT_CLASSIFICATION))
    assert reference["accuracy"] > 0.9  # the head really learned the task
    summary = OptimizeJob(OptimizeConfig(model=str(model), task=TaskName.TEXT_CLASSIFICATION,
                                         output=tmp_path / "out", eval_file=eval_file,
                                         variants=("onnx-fp32",), sensitivity=False)).run()
    assert summary.primary_metric == "accuracy"
    assert summary.reference_metric["accuracy"] == pytest.approx(reference["accuracy"])
    (fp32,) = summary.outcomes
    assert fp32.status == "accepted", fp32.reason
    assert {"accuracy", "f1_macro"} <= fp32.metric.keys()
    assert fp32.metric["accuracy"] == pytest.approx(reference["accuracy"])


def test_question_answering_metric_with_squad2_file(tmp_path):
    model = finetune.qa_model()
    rows = finetune.qa_examples(120, seed=99)
    assert any(not r["answers"] for r in rows)
    eval_file = finetune.write_squad(rows, tmp_path / "dev-v2.json")
    data = load_eval_set(eval_file, TaskName.QUESTION_ANSWERING)
    reference = task_spec("question-answering").validation.evaluate(
        reference_predictor(load_source(str(model), TaskName.QUESTION_ANSWERING)), data)
    assert reference["f1"] > 0.8 and reference["exact_match"] > 0.7
    summary = OptimizeJob(OptimizeConfig(model=str(model), task=TaskName.QUESTION_ANSWERING,
                                         output=tmp_path / "out", eval_file=eval_file,
                                         variants=("onnx-fp32", "onnx-int8-dynamic"), sensitivity=False)).run()
    assert summary.primary_metric == "f1"
    fp32 = summary.outcomes[0]
    assert fp32.status == "accepted" and fp32.metric["f1"] == pytest.approx(reference["f1"], abs=1e-6)
    assert fp32.agreement.figures["answer_f1"] == pytest.approx(1.0)
