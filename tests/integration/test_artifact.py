"""Artifacts are written atomically and refuse to load when altered, truncated or incomplete."""

from __future__ import annotations

import json
import os

import pytest

from kiln.artifact.directory import Artifact
from kiln.artifact.staging import staged_directory
from kiln.errors import ArtifactError


def _copy(src, tmp_path):
    import shutil

    dst = tmp_path / "copy"
    shutil.copytree(src, dst)
    return dst


def test_staging_failure_leaves_nothing(tmp_path):
    target = tmp_path / "out"
    with pytest.raises(RuntimeError), staged_directory(target, overwrite=False) as stage:
        (stage / "model.onnx").write_bytes(b"half")
        raise RuntimeError("crash mid-write")
    assert list(tmp_path.iterdir()) == []


def test_a_killed_runs_staging_directory_is_removed_by_the_next_run(tmp_path):
    """SIGKILL (or the OOM killer) runs no handler, so a killed build leaves its staging directory: the next build
    of the same target removes it when its process is gone, and leaves a live writer's, another host's and one
    whose name names no owner."""
    import subprocess
    import sys

    from kiln.artifact.staging import _host

    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    names = {"killed": f".out.{_host()}-{gone.pid}-{'0' * 16}.partial",
             "live": f".out.{_host()}-{os.getpid()}-{'1' * 16}.partial",
             "other host": f".out.elsewhere-{gone.pid}-{'2' * 16}.partial", "no owner": f".out.{'3' * 16}.partial",
             "other target": f".other.{_host()}-{gone.pid}-{'4' * 16}.partial"}
    for name in names.values():
        (tmp_path / name).mkdir()
        (tmp_path / name / "model.onnx").write_bytes(b"half")
    with staged_directory(tmp_path / "out", overwrite=False) as stage:
        (stage / "done").write_text("y")
    left = {p.name for p in tmp_path.iterdir()}
    assert left == {"out"} | {n for k, n in names.items() if k != "killed"}


def test_existing_target_needs_overwrite(tmp_path):
    target = tmp_path / "out"
    target.mkdir()
    (target / "keep").write_text("x")
    with pytest.raises(ArtifactError, match="already exists; pass --force"):
        with staged_directory(target, overwrite=False):
            pass
    with staged_directory(target, overwrite=True) as stage:
        (stage / "new").write_text("y")
    assert sorted(p.name for p in target.iterdir()) == ["new"]
    assert [p.name for p in tmp_path.iterdir()] == ["out"]


def test_altered_file_is_refused(tiny_artifact, tmp_path):
    art = _copy(tiny_artifact, tmp_path)
    model = art / "onnx-fp32" / "model.onnx"
    data = bytearray(model.read_bytes())
    data[-10] ^= 0xFF
    model.write_bytes(bytes(data))
    with pytest.raises(ArtifactError, match=r"onnx-fp32/model.onnx does not match its sha256 .*altered"):
        Artifact.open(art)


def test_truncated_file_is_refused(tiny_artifact, tmp_path):
    art = _copy(tiny_artifact, tmp_path)
    model = art / "onnx-fp32" / "model.onnx"
    model.write_bytes(model.read_bytes()[:1000])
    with pytest.raises(ArtifactError, match=r"model.onnx is 1000 bytes, the manifest says \d+ \(truncated"):
        Artifact.open(art)


def test_missing_file_and_manifest(tiny_artifact, tmp_path):
    art = _copy(tiny_artifact, tmp_path)
    (art / "tokenizer" / "tokenizer.json").unlink()
    with pytest.raises(ArtifactError, match="tokenizer/tokenizer.json is missing"):
        Artifact.open(art)
    (art / "manifest.json").unlink()
    with pytest.raises(ArtifactError, match="has no manifest.json: it is not a kiln artifact"):
        Artifact.open(art)


def test_malformed_manifest(tiny_artifact, tmp_path):
    art = _copy(tiny_artifact, tmp_path)
    (art / "manifest.json").write_text("{not json")
    with pytest.raises(ArtifactError, match="is not valid JSON"):
        Artifact.open(art)
    (art / "manifest.json").write_text(json.dumps({"schema_version": 99}))
    with pytest.raises(ArtifactError, match="schema_version 99"):
        Artifact.open(art)


def test_unknown_variant_lists_choices(tiny_artifact):
    with pytest.raises(Exception, match=r"variant must be one of: onnx-fp32 \(got 'nope'\)"):
        Artifact.open(tiny_artifact).predictor("nope")


def test_a_signal_right_after_the_staging_directory_is_made_leaves_nothing(tmp_path, monkeypatch):
    """Fault injection: Ctrl-C (or SIGTERM made an exception) lands the instant the .partial exists, before any
    build step: the staging directory is still removed (it was once made outside the cleanup's reach)."""
    from pathlib import Path

    real = Path.mkdir

    def interrupted(self, *args, **kwargs):
        real(self, *args, **kwargs)
        if self.name.endswith(".partial"):
            raise KeyboardInterrupt

    monkeypatch.setattr(Path, "mkdir", interrupted)
    with pytest.raises(KeyboardInterrupt), staged_directory(tmp_path / "art", overwrite=False):
        pass
    assert list(tmp_path.iterdir()) == []
