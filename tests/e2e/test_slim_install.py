"""A serving install (`make slim`: pip install 'kiln[serve,embed]' in .venv-slim) serves and embeds an ONNX artifact
without torch, transformers, scipy or scikit-learn, and refuses to build with the extra to install."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import httpx
import numpy as np
import pytest

from kiln.artifact.directory import Artifact
from kiln.serving import process

SLIM = Path(__file__).resolve().parents[2] / ".venv-slim" / "bin"
pytestmark = pytest.mark.skipif(not (SLIM / "kiln").is_file(), reason="no serving-only venv (run `make slim`)")
TEXTS = ["A serving install answers like the full one.", "short", "Python's documentation ships with Python."]


def test_the_slim_venv_holds_none_of_the_build_dependencies():
    probe = ("import importlib.util, json; print(json.dumps([m for m in ('torch', 'transformers', 'scipy', 'sklearn', "
             "'seqeval', 'onnx') if importlib.util.find_spec(m)]))")
    present = json.loads(subprocess.run([SLIM / "python", "-c", probe], capture_output=True, text=True,
                                        check=True).stdout)
    assert present == []


def test_kiln_serve_from_the_slim_venv_answers_as_the_full_install(tiny_artifact):
    proc, port = process.start_server([str(SLIM / "kiln"), "serve", str(tiny_artifact)])
    try:
        answer = httpx.post(f"http://127.0.0.1:{port}/kiln/embed", json={"inputs": TEXTS}, timeout=30)
    finally:
        proc.terminate()
        assert proc.wait(timeout=60) == 0
    want = np.stack(Artifact.open(tiny_artifact).predictor().predict(TEXTS))
    np.testing.assert_allclose(np.array(answer.json()["embeddings"]), want, atol=1e-5)


def test_kiln_embed_runs_and_building_names_the_extra(tiny_artifact, tmp_path):
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("".join(json.dumps({"text": t}) + "\n" for t in TEXTS))
    done = subprocess.run([SLIM / "kiln", "embed", str(tiny_artifact), str(corpus), "-o", str(tmp_path / "out")],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert sorted(p.name for p in (tmp_path / "out").glob("*.parquet"))
    refused = subprocess.run([SLIM / "kiln", "optimize", "-o", str(tmp_path / "o")], capture_output=True, text=True,
                             timeout=120)
    assert refused.returncode != 0 and "Traceback" not in refused.stderr, refused.stderr
    assert "pip install 'kiln[build]'" in refused.stderr
