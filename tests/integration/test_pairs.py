"""Sentence-pair classification: tokenized as the model's tokenizer does pairs, equal to transformers' pipeline."""

from __future__ import annotations

import csv

import numpy as np
import pytest
import transformers
from fastapi.testclient import TestClient

import kiln
from kiln.data.texts import builtin_pairs, builtin_sentences, joined
from kiln.errors import UsageError
from kiln.source.loading import load_source
from kiln.source.reference import reference_predictor
from kiln.tasks import TaskName, TextPair

CLS = TaskName.TEXT_CLASSIFICATION


@pytest.mark.parametrize("arch", ["bert", "roberta", "modernbert"])  # token types; RoBERTa: two separators
def test_pairs_match_the_transformers_pipeline(tiny_model, arch):
    model_dir = tiny_model(arch, CLS)
    pipe = transformers.pipeline("text-classification", model=str(model_dir), tokenizer=str(model_dir))
    pairs = builtin_pairs(8)
    want = pipe([{"text": a, "text_pair": b} for a, b in pairs], top_k=None, truncation=True)
    got = reference_predictor(load_source(str(model_dir), CLS)).predict([TextPair(a, b) for a, b in pairs],
                                                                        top_k=None)
    for expected, result in zip(want, got):
        expected = {e["label"]: e["score"] for e in expected}
        assert {r.label for r in result} == set(expected)
        for r in result:
            assert r.score == pytest.approx(expected[r.label], abs=1e-5)


def test_an_over_long_pair_loses_tokens_from_its_longer_text_first(tiny_model):
    model_dir = tiny_model("bert", CLS)
    source = load_source(str(model_dir), CLS)
    predictor = reference_predictor(source)
    long_text, short_text = joined(0, 30), builtin_sentences()[3]
    prepared = predictor.prepare([TextPair(long_text, short_text)])
    expected = source.tokenizer(long_text, short_text, truncation="longest_first",
                                max_length=source.task_config.max_length)["input_ids"]
    assert prepared.encodings[0].ids == expected and prepared.truncated == (True,)


def test_exported_pairs_match_pytorch_and_serve_over_http(tiny_model, tmp_path):
    from kiln.choices import ExportFormat
    from kiln.exporting.job import ExportConfig, run_export
    from kiln.serving.app import ServeConfig, create_app

    model_dir = tiny_model("bert", CLS)
    result = run_export(ExportConfig(model=str(model_dir), task=CLS, format=ExportFormat.ONNX, output=tmp_path / "a"))
    assert result.parity.passed  # the parity inputs include pairs
    pairs = [TextPair(a, b) for a, b in builtin_pairs(6, seed=3)]
    offline = kiln.load(tmp_path / "a").predict(pairs, top_k=None)
    torch_out = reference_predictor(load_source(str(model_dir), CLS)).predict(pairs, top_k=None)
    for a, b in zip(offline, torch_out):
        assert [x.label for x in a] == [x.label for x in b]
        np.testing.assert_allclose([x.score for x in a], [x.score for x in b], atol=1e-5)
    with TestClient(create_app(ServeConfig(models={"pairs": tmp_path / "a"}))) as client:
        body = {"inputs": [{"text": p.text, "text_pair": p.text_pair} for p in pairs] + ["a single text"]}
        served = client.post("/classify", json=body).json()["results"]
    assert [r[0]["label"] for r in served[:-1]] == [r[0].label for r in offline]


def test_optimize_a_pair_model_on_an_mrpc_style_file(tiny_model, tmp_path):
    from kiln.optimizing.job import OptimizeConfig, OptimizeJob

    model_dir = tiny_model("bert", CLS)
    pairs = builtin_pairs(24, seed=11)
    labels = [r[0].label for r in reference_predictor(load_source(str(model_dir), CLS)).predict(
        [TextPair(a, b) for a, b in pairs])]
    eval_file = tmp_path / "mrpc.csv"
    with eval_file.open("w", newline="") as fh:
        writer = csv.writer(fh)
        writer.writerow(["sentence1", "sentence2", "label"])
        writer.writerows([a, b, label] for (a, b), label in zip(pairs, labels))
    summary = OptimizeJob(OptimizeConfig(model=str(model_dir), task=CLS, output=tmp_path / "o", eval_file=eval_file,
                                         variants=("onnx-fp32", "onnx-int8-dynamic"))).run()
    assert summary.primary_metric == "accuracy" and summary.reference_metric["accuracy"] == 1.0
    fp32 = summary.outcomes[0]
    assert fp32.status == "accepted" and fp32.metric["accuracy"] == 1.0 and "f1_macro" in fp32.metric
    assert kiln.load(tmp_path / "o" / "best").predict([TextPair(*pairs[0])])[0][0].label == labels[0]


def test_inputs_of_the_wrong_shape_name_what_the_task_accepts(task_artifacts):
    embed = kiln.load(task_artifacts[TaskName.FEATURE_EXTRACTION])
    with pytest.raises(UsageError, match=r"feature-extraction inputs must be strings \(input 1 is dict\)"):
        embed.predict(["fine", {"text": "a", "text_pair": "b"}])
    classify = kiln.load(task_artifacts[CLS])
    with pytest.raises(UsageError, match=r"text-classification inputs must be a string, \{'text': …, 'text_pair'"):
        classify.predict([3])
    answer = kiln.load(task_artifacts[TaskName.QUESTION_ANSWERING])
    with pytest.raises(UsageError, match=r"question-answering inputs must be \{'question': …, 'context': …\}"):
        answer.predict(["a question without a context"])
    assert classify.predict([{"text": "a", "text_pair": "b"}])[0]  # the pipeline's dict spelling works
