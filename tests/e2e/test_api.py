"""The Python API: one plain function per CLI command (kiln.api), which the command is made of. Each has every option
of its command as a parameter with the same default; library errors name the parameter, the CLI names the flag."""

from __future__ import annotations

import enum
import inspect
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import typer

import kiln
from kiln.cli.app import app
from kiln.cli.flags import ALIASES, flags_of
from kiln.data import corpus
from kiln.errors import UsageError

RECIPE = {"epochs": 1, "batch_size": 8, "max_length": 48}
COMMANDS = ("export", "optimize", "distill", "prune", "embed", "bench", "serve", "audit", "triton", "info", "doctor")
# Options that shape only what the command prints, or pick another function: not parameters of the command's function.
CLI_ONLY = {"distill": {"log_every"}, "prune": {"log_every"}, "bench": {"compare"}}  # bench --compare: compare_results
CALLBACKS = {"progress", "progress_bar"}  # what a command draws progress with: the function's, not an option


def test_import_kiln_stays_free_of_torch_and_every_command_is_a_plain_function():
    code = ("import sys, types, kiln; import kiln.optimizing.job, kiln.exporting.job, kiln.serving.app; "
            f"print(all(isinstance(getattr(kiln, n), types.FunctionType) for n in {COMMANDS!r}), "
            "'torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    # kiln.optimizing.job imports torch itself; kiln.optimize is still the function once its package is imported
    assert out[0] == "True"
    light = subprocess.run([sys.executable, "-c", "import sys, kiln; kiln.optimize; kiln.serve; "
                            "print('torch' in sys.modules)"], capture_output=True, text=True, check=True).stdout
    assert light.strip() == "False"


def _default(value):
    """A CLI default as the function's: enums by value, paths as strings."""
    if isinstance(value, enum.Enum):
        return value.value
    return str(value) if isinstance(value, Path) else value


@pytest.mark.parametrize("command", COMMANDS)
def test_every_option_of_a_command_is_a_parameter_of_its_function_with_the_same_default(command):
    cli = typer.main.get_command(app).commands[command]
    function = inspect.signature(getattr(kiln, command)).parameters
    library_name = {cli_name: name for name, cli_name in ALIASES.items()}  # --force is overwrite
    options = {library_name.get(p.name, p.name): p for p in cli.params}
    cli_names = set(options) - CLI_ONLY.get(command, set())
    assert cli_names == set(function) - CALLBACKS, (cli_names ^ (set(function) - CALLBACKS))
    for name in cli_names:
        cli_default, default = _default(options[name].default), _default(function[name].default)
        if name in ("variants", "batch_sizes", "seq_lens", "buckets", "distill_layers", "static_dims",
                    "matryoshka_dims", "precisions", "for_classes", "keep_layers", "prune", "model", "protocols"):
            continue  # a comma-separated option is a sequence parameter: None or "" on the CLI, () or None here
        if function[name].default is inspect.Parameter.empty:
            continue  # a required argument
        assert cli_default == default, f"{command} {name}: CLI {cli_default!r}, function {default!r}"


def test_library_errors_name_the_parameter_and_the_cli_names_the_flag(tmp_path):
    with pytest.raises(UsageError, match=r"^target must be one of: cpu, cuda"):
        kiln.optimize(target="tpu", output=tmp_path / "bad")
    with pytest.raises(UsageError, match=r"^tolerance must be between 0 and 1"):
        kiln.optimize(tolerance=3, output=tmp_path / "bad")
    cli = subprocess.run([sys.executable, "-m", "kiln", "optimize", "--tolerance", "3", "-o", str(tmp_path / "b")],
                         capture_output=True, text=True)
    assert cli.returncode == 2 and cli.stderr.strip() == "error: --tolerance must be between 0 and 1 (got 3)"
    assert flags_of(typer.main.get_command(app).commands["optimize"])["eval_file"] == "--eval"


def test_export_optimize_and_bench_from_python(tiny_model, tmp_path):
    model = tiny_model("bert")
    exported = kiln.export(model, output=tmp_path / "exported")
    assert exported.parity.min_cosine > 0.9999 and exported.artifact.variant_name() == "onnx-fp32"
    result = kiln.optimize(model, variants=["onnx-fp32"], output=tmp_path / "opt")
    assert isinstance(result.artifact, kiln.Artifact) and (result.artifact.path / "best" / "manifest.json").is_file()
    assert result.summary.best == "onnx-fp32" and not result.students
    texts = ["one text", "and another one"]
    np.testing.assert_allclose(np.stack(kiln.load(result.artifact.path / "best").predict(texts)),
                               np.stack(exported.artifact.predictor().predict(texts)), atol=1e-5)
    results = kiln.bench(result.artifact.path, output=tmp_path / "bench", quick=True, sweep=False)
    assert [t.name for t in results.targets][-1] == "onnx-fp32"
    assert (tmp_path / "bench" / "report.html").is_file()
    shown = kiln.info(result.artifact.path / "best")
    assert shown.manifest.build.best == "onnx-fp32" and shown.pick.variant == "onnx-fp32"


def test_distill_and_prune_from_python(tiny_model, tmp_path):
    texts = tmp_path / "texts.txt"
    texts.write_text("\n".join(corpus.sentences("calibration")[:64]) + "\n")
    student = kiln.distill(tiny_model("bert"), layers=1, texts=texts, output=tmp_path / "student", **RECIPE)
    assert student.keep and (student.path / "kiln-distill.json").is_file() and 0 < student.agreement <= 1
    pruned = kiln.prune(tiny_model("bert"), ffn=0.5, texts=texts, recover_epochs=1, batch_size=8, max_length=48,
                        output=tmp_path / "pruned")
    assert (pruned.path / "kiln-prune.json").is_file() and pruned.parameters < pruned.teacher_parameters
