"""A real `kiln serve` process on 127.0.0.1: the openai client, and SIGTERM under load loses nothing."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time

import httpx
import numpy as np
import pytest

from kiln.artifact import Artifact
from kiln.choices import ExportFormat, TaskName
from kiln.exporting import ExportConfig, run_export
from kiln.texts import builtin_sentences


@pytest.fixture(scope="module")
def artifact(tiny_model, tmp_path_factory):
    path = tmp_path_factory.mktemp("served") / "art"
    run_export(ExportConfig(model=str(tiny_model("bert")), task=TaskName.FEATURE_EXTRACTION,
                            format=ExportFormat.ONNX, output=path))
    return path


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(artifact, *args: str) -> tuple[subprocess.Popen, int]:
    """Start `kiln serve` and return once uvicorn reports startup complete (read from its log, no polling)."""
    port = _free_port()
    proc = subprocess.Popen([sys.executable, "-m", "kiln", "serve", str(artifact), "--port", str(port), *args],
                            stderr=subprocess.PIPE, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    deadline = time.monotonic() + 120
    for line in proc.stderr:
        if "Application startup complete" in line:
            break
        if time.monotonic() > deadline or proc.poll() is not None:
            proc.kill()
            pytest.fail(f"server did not start: {line}")
    threading.Thread(target=lambda: [None for _ in proc.stderr], daemon=True).start()  # keep draining its log
    return proc, port


def test_openai_client_against_a_real_server(artifact):
    import openai

    proc, port = start_server(artifact)
    try:
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="unused", max_retries=0)
        assert [m.id for m in client.models.list().data] == ["art"]
        texts = list(builtin_sentences()[:5])
        response = client.embeddings.create(model="art", input=texts)
        got = np.array([d.embedding for d in response.data])
        want = np.stack(Artifact.open(artifact).predictor().predict(texts))
        np.testing.assert_allclose(got, want, atol=1e-5)
        assert response.usage.prompt_tokens > 0
    finally:
        proc.terminate()
        assert proc.wait(timeout=60) == 0


def test_sigterm_under_load_finishes_every_accepted_request(artifact):
    proc, port = start_server(artifact, "--max-delay-ms", "20")
    url = f"http://127.0.0.1:{port}/embed"
    outcomes: list[str] = []
    lock = threading.Lock()
    stop = threading.Event()

    def client(k: int) -> None:
        i = 0
        while not stop.is_set() and i < 200:  # bounded: at most 200 requests per client
            i += 1
            try:  # a new connection each time: after SIGTERM the listening socket refuses at connect
                response = httpx.post(url, json={"inputs": builtin_sentences()[(k + i) % 50]}, timeout=30)
                outcome = "answered" if response.status_code == 200 else f"status {response.status_code}"
            except httpx.ConnectError:
                outcome = "rejected"
            except httpx.HTTPError as err:  # accepted, then dropped without an answer
                outcome = f"lost ({type(err).__name__})"
            with lock:
                outcomes.append(outcome)
            if outcome == "rejected":
                return

    threads = [threading.Thread(target=client, args=(k,)) for k in range(16)]
    for t in threads:
        t.start()
    while len(outcomes) < 40 and proc.poll() is None:  # let load build up before the signal
        time.sleep(0.01)
    proc.send_signal(signal.SIGTERM)
    code = proc.wait(timeout=60)
    stop.set()
    for t in threads:
        t.join(timeout=60)
    answered = outcomes.count("answered")
    others = [o for o in outcomes if o not in ("answered", "rejected")]
    assert code == 0
    assert answered >= 40
    assert others == [], others  # nothing lost, no error answers


def test_serve_cli_errors(tmp_path):
    missing = subprocess.run([sys.executable, "-m", "kiln", "serve", str(tmp_path / "nope")], capture_output=True,
                             text=True, timeout=60)
    assert missing.returncode == 1 and "does not exist" in missing.stderr
    bad = subprocess.run([sys.executable, "-m", "kiln", "serve", "--model", "noequals"], capture_output=True,
                         text=True, timeout=60)
    assert bad.returncode == 2 and "--model must be NAME=ARTIFACT" in bad.stderr
