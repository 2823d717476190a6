"""A new task is one module and one registry line: a dummy task registered in the test is exported, loaded and
optimized like the others (the static checks of the task registry are in tests/unit/test_task_registry.py)."""

from __future__ import annotations

import json

import pytest

import kiln
from kiln.tasks import TASKS


@pytest.fixture
def dummy_task(monkeypatch):
    from tests.dummy_task import TokenNorms

    monkeypatch.setitem(TASKS, TokenNorms.name, TokenNorms)  # the one registry line
    return TokenNorms


def test_a_new_task_is_one_module_and_one_registry_line(dummy_task, tiny_model, tmp_path):
    from kiln.choices import ExportFormat
    from kiln.exporting.job import ExportConfig, run_export
    from kiln.optimizing.job import OptimizeConfig, OptimizeJob

    model = str(tiny_model("bert"))
    exported = run_export(ExportConfig(model=model, task=dummy_task.name, format=ExportFormat.ONNX,
                                       output=tmp_path / "export"))
    assert exported.parity.passed and exported.parity.max_abs_diff < 1e-4
    norms = kiln.load(tmp_path / "export").predict(["a short sentence", "and a somewhat longer second one"])
    assert len(norms) == 2 and len(norms[1]) > len(norms[0]) and all(n > 0 for n in norms[0])
    rows = [{"text": t, "mean_norm": 5.0} for t in ("one text", "another text here", "a third")]
    eval_file = tmp_path / "norms.jsonl"
    eval_file.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    summary = OptimizeJob(OptimizeConfig(model=model, task=dummy_task.name, output=tmp_path / "opt",
                                         eval_file=eval_file, variants=("onnx-fp32",))).run()
    (fp32,) = summary.outcomes
    assert fp32.status == "accepted" and fp32.agreement.primary == "min_cosine"
    assert summary.primary_metric == "neg_mae" and fp32.metric["neg_mae"] == pytest.approx(
        summary.reference_metric["neg_mae"], abs=1e-4)
    assert kiln.load(tmp_path / "opt" / "best").predict(["one text"])[0]


