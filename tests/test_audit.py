"""kiln audit: a deployment's vectors against the original's, with the cause of a gap found by measurement.

Against kiln serve (agrees), against a misconfigured server (CLS pooling, truncated at 32 tokens: the audit must
name both), and every way asking can fail (bad URL, nothing listening, not JSON, wrong shapes, a timeout): one
clear message and a non-zero exit each, never a traceback or a hang.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
import sys

import pytest

from kiln.artifact.manifest import MANIFEST_NAME
from kiln.audit.job import AuditConfig, run_audit
from kiln.audit.protocols import AuditError, Endpoint
from kiln.serve import process
from kiln.serve.app import ServeConfig, create_app


def audit_cli(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "kiln", "audit", *args], capture_output=True, text=True,
                          timeout=timeout)


def test_kiln_serve_agrees_with_its_original(tiny_model, tiny_artifact, tmp_path):
    with process.serve_in_thread(create_app(ServeConfig(models={"m": tiny_artifact}))) as base:
        for protocol in ("openai", "kiln"):
            result = run_audit(AuditConfig(Endpoint(base, protocol, "m"), str(tiny_model("bert")), count=24,
                                           output=tmp_path / protocol))
            assert result.within_tolerance and result.min_cosine > 0.9999, result.verdict()
            assert not any(f.differs for f in result.findings), result.findings
    page = (tmp_path / "kiln" / "audit.html").read_text()
    assert "within tolerance" in page and json.loads((tmp_path / "kiln" / "audit.json").read_text())["schema"]


def test_a_misconfigured_server_is_outside_tolerance_with_both_causes_named(tiny_model, tiny_artifact, tmp_path):
    """The same weights served with CLS pooling and a 32-token truncation (a misconfigured kiln deployment)."""
    wrong = tmp_path / "wrong"
    shutil.copytree(tiny_artifact, wrong)
    manifest = json.loads((wrong / MANIFEST_NAME).read_text())
    manifest["task"]["pooling"], manifest["task"]["max_length"] = "cls", 32
    (wrong / MANIFEST_NAME).write_text(json.dumps(manifest))
    with process.serve_in_thread(create_app(ServeConfig(models={"m": wrong}))) as base:
        run = audit_cli(base, str(tiny_model("bert")), "--protocol", "kiln", "--count", "32", "-o",
                        str(tmp_path / "out"))
    assert run.returncode == 4, run.stderr
    findings = {f["cause"]: f for f in json.loads((tmp_path / "out" / "audit.json").read_text())["findings"]}
    assert findings["pooling"]["differs"] and findings["pooling"]["found"].startswith("cls")
    assert findings["truncation"]["differs"] and findings["truncation"]["found"].startswith("32 tokens")
    assert not findings["prefix"]["differs"] and not findings["normalisation"]["differs"]
    assert "explained by pooling, truncation" in run.stderr and "outside tolerance" in run.stderr


def _bad_app(mode: str):
    """A server that answers /embed and /v1/embeddings badly, one way per mode."""
    from fastapi import FastAPI
    from fastapi.responses import JSONResponse, PlainTextResponse

    app = FastAPI()

    @app.post("/v1/embeddings")
    async def embeddings(body: dict):
        if mode == "text":
            return PlainTextResponse("this is not json")
        if mode == "slow":
            await asyncio.sleep(5)
        if mode == "error":
            return JSONResponse({"detail": "model exploded"}, status_code=500)
        vectors = [[0.1, 0.2, 0.3]] * len(body["input"])
        if mode == "ragged":
            vectors[-1] = [0.1]
        return {"data": [{"embedding": v, "index": i} for i, v in enumerate(vectors)]}

    return app


@pytest.mark.parametrize(("mode", "message"), [
    ("text", "answered with something that is not JSON"),
    ("ragged", "the answer is not a list of numeric vectors"),
    ("error", "answered HTTP 500"),
    ("slow", "did not answer within 0.5 s (--timeout)"),
    ("shape", "returns 3-dimensional vectors"),
])
def test_every_failure_is_one_clear_error(tiny_model, mode, message, tmp_path):
    """In process (the CLI turns any AuditError into its message and exit 3: see the test below)."""
    with process.serve_in_thread(_bad_app(mode)) as base, pytest.raises(AuditError) as caught:
        run_audit(AuditConfig(Endpoint(base, "openai", timeout_s=0.5), str(tiny_model("bert")), count=8,
                              output=tmp_path))
    assert message in caught.value.message and caught.value.exit_code == 3


def test_bad_urls_and_nothing_listening(tiny_model, tmp_path):
    bad = audit_cli("ftp://example", str(tiny_model("bert")), timeout=60)
    assert bad.returncode == 2 and "URL must be http(s)://host[:port][/prefix]" in bad.stderr
    port = process.free_port()
    gone = audit_cli(f"http://127.0.0.1:{port}", str(tiny_model("bert")), "--count", "8", "-o", str(tmp_path),
                     timeout=60)
    assert gone.returncode == 3 and f"nothing answers at http://127.0.0.1:{port}" in gone.stderr
    with pytest.raises(AuditError, match="nothing answers"):
        from kiln.audit.protocols import embed

        embed(Endpoint(f"http://127.0.0.1:{port}", "tei"), ["x"])


INFINITY = __import__("pathlib").Path(__file__).resolve().parents[1] / ".venv-infinity" / "bin" / "infinity_emb"


@pytest.mark.skipif(not INFINITY.is_file(), reason="no Infinity venv (run `make infinity-server`)")
def test_infinity_serving_the_bundled_minilm_agrees_with_it(minilm_dir, tmp_path):
    """A deployment nobody here wrote: Infinity (infinity-emb 0.0.78, PyTorch engine) serving the bundled MiniLM."""
    import os

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    proc, port = process.start_server([str(INFINITY), "v2", "--model-id", str(minilm_dir), "--served-model-name",
                                       "minilm", "--engine", "torch", "--device", "cpu", "--host", "127.0.0.1",
                                       "--no-bettertransformer"], timeout_s=180)
    try:
        result = run_audit(AuditConfig(Endpoint(f"http://127.0.0.1:{port}", "openai", "minilm"), None, count=24,
                                       output=tmp_path))
    finally:
        proc.terminate()
        proc.wait(timeout=60)
    assert result.within_tolerance and result.min_cosine > 0.9999, result.verdict()
    assert {f.cause: f.differs for f in result.findings} == {"pooling": False, "normalisation": False,
                                                             "truncation": False, "prefix": False,
                                                             "batch drift": False}
