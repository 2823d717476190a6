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


def _limited(size: int):
    """A child's largest file: RLIMIT_FSIZE, as a full disk answers a write (EFBIG; Python ignores SIGXFSZ)."""
    import resource

    return lambda: resource.setrlimit(resource.RLIMIT_FSIZE, (size, size))


@pytest.mark.parametrize("command", ["export", "optimize", "embed"])
def test_a_full_disk_is_one_clear_error_and_leaves_nothing_half_written(command, tiny_model, tiny_artifact, tmp_path):
    """Fault injection: a file-size limit below what the command writes (a full disk answers the same way). One line
    naming the cause, exit 1, no traceback; no artifact or staging directory, no Parquet part (kiln embed keeps its
    resumable state file only)."""
    out = tmp_path / "out"
    corpus = tmp_path / "corpus.csv"
    corpus.write_text("text\n" + "\n".join(f"line {i} of a small corpus about kilns" for i in range(2000)))
    args = {"export": ["export", str(tiny_model("bert")), "-o", str(out)],
            "optimize": ["optimize", str(tiny_model("bert")), "--variants", "onnx-fp32", "-o", str(out)],
            "embed": ["embed", str(tiny_artifact), str(corpus), "-o", str(out)]}[command]
    run = subprocess.run([sys.executable, "-m", "kiln", *args], capture_output=True, text=True,
                         preexec_fn=_limited(20_000), env={**os.environ, "HF_HUB_OFFLINE": "1"}, timeout=600)
    assert run.returncode == 1 and "Traceback" not in run.stderr, run.stderr[-3000:]
    assert run.stderr.strip().splitlines()[-1].startswith("error: no room writing"), run.stderr[-2000:]
    assert "File too large" in run.stderr and "Nothing was left half-written" in run.stderr
    left = sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*") if p.name != "corpus.csv")
    assert left == (["out", "out/kiln-embed.json"] if command == "embed" else []), left


def test_a_killed_optimize_reruns_to_a_complete_artifact(tiny_model, tmp_path):
    """Fault injection: SIGKILL mid-run (no handler runs) leaves only the hidden staging directory; the rerun
    removes it and writes a complete artifact whose every checksum kiln info verifies."""
    out, model = tmp_path / "art", str(tiny_model("bert"))
    command = [sys.executable, "-m", "kiln", "optimize", model, "--variants", "onnx-fp32,openvino-fp32", "-o", str(out)]
    proc = subprocess.Popen(command, stderr=subprocess.PIPE, text=True, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    try:
        for line in proc.stderr:
            if "building openvino-fp32" in line:
                proc.send_signal(signal.SIGKILL)
                break
        proc.wait(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == -signal.SIGKILL
    assert [p.name.endswith(".partial") for p in tmp_path.iterdir()] == [True]
    rerun = subprocess.run(command, capture_output=True, text=True, timeout=600)
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["art"]
    info = subprocess.run([sys.executable, "-m", "kiln", "info", str(out)], capture_output=True, text=True)
    assert info.returncode == 0 and "files verified" in info.stdout, info.stdout + info.stderr
