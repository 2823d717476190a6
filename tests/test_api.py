"""The Python API for building: kiln.export, kiln.optimize, kiln.bench, kiln.distill and kiln.prune are the
functions the CLI's commands run, callable however ``kiln.<name>`` was reached."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

import kiln
from kiln.data import corpus
from kiln.errors import UsageError

RECIPE = {"epochs": 1, "batch_size": 8, "max_length": 48}


def test_import_kiln_stays_free_of_torch_and_the_builders_are_callable():
    code = ("import sys, kiln; import kiln.optimize.job, kiln.export.job; "
            "print(callable(kiln.optimize), callable(kiln.export), callable(kiln.bench), 'torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    # kiln.optimize.job imports torch itself; the packages stay callable after their modules are imported
    assert out[:3] == ["True", "True", "True"]
    light = subprocess.run([sys.executable, "-c", "import sys, kiln; kiln.optimize; print('torch' in sys.modules)"],
                           capture_output=True, text=True, check=True).stdout.strip()
    assert light == "False"


def test_export_optimize_and_bench_from_python(tiny_model, tmp_path):
    model = tiny_model("bert")
    exported = kiln.export(model, output=tmp_path / "exported")
    assert isinstance(exported, kiln.Artifact) and exported.variant_name() == "onnx-fp32"
    assert exported.variant().parity.min_cosine > 0.9999
    artifact = kiln.optimize(model, variants=["onnx-fp32"], output=tmp_path / "opt")
    assert isinstance(artifact, kiln.Artifact) and (artifact.path / "best" / "manifest.json").is_file()
    texts = ["one text", "and another one"]
    np.testing.assert_allclose(np.stack(kiln.load(artifact.path / "best").predict(texts)),
                               np.stack(exported.predictor().predict(texts)), atol=1e-5)
    results = kiln.bench(artifact.path, output=tmp_path / "bench", quick=True, sweep=False)
    assert [t.name for t in results.targets][-1] == "onnx-fp32"
    assert (tmp_path / "bench" / "report.html").is_file()
    with pytest.raises(UsageError, match="--target must be one of: cpu, cuda"):
        kiln.optimize(model, target="tpu", output=tmp_path / "bad")


def test_distill_and_prune_from_python(tiny_model, tmp_path):
    texts = tmp_path / "texts.txt"
    texts.write_text("\n".join(corpus.sentences("calibration")[:64]) + "\n")
    student = kiln.distill(tiny_model("bert"), layers=1, texts=texts, recipe=RECIPE, output=tmp_path / "student")
    assert student.keep and (student.path / "kiln-distill.json").is_file() and 0 < student.agreement <= 1
    pruned = kiln.prune(tiny_model("bert"), ffn=0.5, texts=texts, recipe=RECIPE, output=tmp_path / "pruned")
    assert (pruned.path / "kiln-prune.json").is_file() and pruned.parameters < pruned.teacher_parameters
