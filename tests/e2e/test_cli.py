"""The command line as a user runs it: help, export, info, and one-line errors with non-zero exits."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest

from kiln.tasks import TaskName
from tests.waiting import wait_until


def kiln(*args: str, cwd=None) -> subprocess.CompletedProcess:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "COLUMNS": "200"}
    return subprocess.run([sys.executable, "-m", "kiln", *args], capture_output=True, text=True, cwd=cwd, env=env,
                          timeout=300)


def test_help_lists_commands_and_explains_options():
    top = kiln("--help")
    assert top.returncode == 0
    assert "export" in top.stdout and "info" in top.stdout
    export = kiln("export", "--help").stdout
    for option in ("--task", "--format", "--output", "--opset", "--int32-inputs", "--external-data", "--atol",
                   "--min-cosine", "--allow-pickle", "--force"):
        assert option in export
    assert "arbitrary code" in export and "2 GB" in export and "feature-extraction" in export


def test_export_then_info(tiny_model, tmp_path):
    out = tmp_path / "art"
    result = kiln("export", str(tiny_model("distilbert")), "--format", "torchscript", "-o", str(out))
    assert result.returncode == 0, result.stderr
    assert "parity vs PyTorch: max |diff|" in result.stdout
    info = kiln("info", str(out))
    assert info.returncode == 0, info.stderr
    assert "variant    torchscript (best): torchscript torchscript/model.pt" in info.stdout
    assert "files verified" in info.stdout


def test_info_fails_on_altered_artifact(tiny_model, tmp_path):
    out = tmp_path / "art"
    assert kiln("export", str(tiny_model("bert")), "-o", str(out)).returncode == 0
    with (out / "tokenizer" / "tokenizer.json").open("a") as fh:
        fh.write(" ")
    info = kiln("info", str(out))
    assert info.returncode == 1
    assert "failed verification: tokenizer/tokenizer.json is" in info.stderr
    assert "Traceback" not in info.stderr


@pytest.mark.parametrize(("args", "code", "message"), [
    (["export", "./missing-model"], 1, "error: model directory ./missing-model does not exist"),
    (["export", "--task", "summarize"], 2, "'summarize' is not one of"),
    (["export", "--format", "tflite"], 2, "'tflite' is not one of"),
    (["export", "--min-cosine", "3"], 2, "--min-cosine must be between 0 and 1 (got 3.0)"),
    (["info", "/nonexistent/artifact"], 1, "error: artifact directory /nonexistent/artifact does not exist"),
])
def test_bad_input_is_one_clear_line(args, code, message, tmp_path):
    result = kiln(*args, "-o", str(tmp_path / "o")) if args[0] == "export" else kiln(*args)
    assert result.returncode == code
    assert message in result.stderr
    assert "Traceback" not in result.stderr


def test_existing_output_needs_force(tiny_model, tmp_path):
    out = tmp_path / "art"
    out.mkdir()
    result = kiln("export", str(tiny_model("bert")), "-o", str(out))
    assert result.returncode == 1 and "already exists; pass --force" in result.stderr


def test_a_terminated_export_leaves_nothing_behind(tiny_model, tmp_path):
    """Fault injection: SIGTERM while the artifact is being staged unwinds the build like Ctrl-C: exit 143, one
    line, and neither the artifact nor its hidden staging directory is left on disk."""
    out = tmp_path / "art"
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "kiln", "export", str(tiny_model("gpt2", TaskName.TEXT_GENERATION)),
                             "--task", "text-generation", "-o", str(out)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env)
    try:
        wait_until(lambda: any(tmp_path.glob(".art.*.partial")) or proc.poll() is not None, "the staging directory",
                   timeout=120)
        assert proc.poll() is None, "the export finished before it could be terminated"
        proc.send_signal(signal.SIGTERM)
        _, stderr = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 143 and stderr.strip().splitlines()[-1] == "terminated", stderr
    assert "Traceback" not in stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == []
