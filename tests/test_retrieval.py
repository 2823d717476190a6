"""Retrieval workloads (issue 13): Matryoshka sizes, rerankers, sparse embeddings, long documents."""

from __future__ import annotations

import json

import pytest

from kiln.artifact.directory import Artifact
from kiln.errors import UsageError
from kiln.optimize.job import OptimizeConfig, OptimizeJob
from kiln.tasks import TaskName


def test_matryoshka_sizes_are_validated_gated_and_recorded(tiny_model, tmp_path):
    out = tmp_path / "out"
    summary = OptimizeJob(OptimizeConfig(model=str(tiny_model("bert")), task=TaskName.FEATURE_EXTRACTION, output=out,
                                         variants=("onnx-fp32", "onnx-int8-dynamic"), matryoshka_dims=(8, 16))).run()
    for outcome in summary.outcomes:
        figures = outcome.agreement.figures
        assert {"min_cosine@16", "mean_cosine@16", "min_cosine@8", "mean_cosine@8"} <= figures.keys()
    assert summary.outcomes[0].agreement.figures["min_cosine@8"] == pytest.approx(1.0, abs=1e-5)
    # A cut vector agrees less than the whole one under int8 noise, never more than it can (a check on the sums).
    assert all(0 < v <= 1 + 1e-6 for k, v in summary.outcomes[1].agreement.figures.items() if "@" in k)
    assert Artifact.open(out).task_config.matryoshka_dims == (16, 8)
    assert json.loads((out / "manifest.json").read_text())["task"]["dimension"] == 32


def test_matryoshka_sizes_larger_than_the_model_or_on_other_tasks_are_refused(tiny_model, tmp_path):
    with pytest.raises(UsageError, match=r"--matryoshka-dims must be at most the embedding size 32 .* \(got 64\)"):
        OptimizeJob(OptimizeConfig(model=str(tiny_model("bert")), task=TaskName.FEATURE_EXTRACTION,
                                   output=tmp_path / "o", variants=("onnx-fp32",), matryoshka_dims=(64,))).run()
    with pytest.raises(UsageError, match="--matryoshka-dims applies to embedding tasks"):
        OptimizeConfig(model=None, task=TaskName.TEXT_CLASSIFICATION, output=tmp_path, matryoshka_dims=(8,))
