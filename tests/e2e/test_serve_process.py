"""A real `kiln serve` process on 127.0.0.1: the openai client, and SIGTERM under load loses nothing."""

from __future__ import annotations

import itertools
import socket
import subprocess
import sys
import threading

import httpx
import numpy as np
import pytest

from kiln.artifact.directory import Artifact
from kiln.data.texts import builtin_sentences
from kiln.serving import process
from tests.waiting import sigterm_under_load, wait_until


def start_server(artifact, *args: str) -> tuple[subprocess.Popen, int]:
    """Start `kiln serve` and return once uvicorn reports it listens (read from its log, no polling)."""
    try:
        return process.start_server([sys.executable, "-m", "kiln", "serve", str(artifact), *args])
    except process.ServerStartError as err:
        pytest.fail(str(err))


def test_openai_client_against_a_real_server(tiny_artifact):
    import openai

    proc, port = start_server(tiny_artifact)
    try:
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="unused", max_retries=0)
        assert [m.id for m in client.models.list().data] == ["art"]
        texts = list(builtin_sentences()[:5])
        response = client.embeddings.create(model="art", input=texts)
        got = np.array([d.embedding for d in response.data])
        want = np.stack(Artifact.open(tiny_artifact).predictor().predict(texts))
        np.testing.assert_allclose(got, want, atol=1e-5)
        assert response.usage.prompt_tokens > 0
    finally:
        proc.terminate()
        assert proc.wait(timeout=60) == 0


def test_sigterm_under_load_finishes_every_accepted_request(tiny_artifact):
    # A narrow batch window too: under load every request is still answered (the window only orders them).
    proc, port = start_server(tiny_artifact, "--max-delay-ms", "20", "--batch-window", "4")
    url = f"http://127.0.0.1:{port}/kiln/embed"

    def client(k: int):
        sent = itertools.count(k + 1)

        def send() -> str:
            try:  # a new connection each time: after SIGTERM the listening socket refuses at connect
                response = httpx.post(url, json={"inputs": builtin_sentences()[next(sent) % 50]}, timeout=30)
                return "answered" if response.status_code == 200 else f"status {response.status_code}"
            except httpx.ConnectError:
                return "rejected"
            except httpx.HTTPError as err:  # reset after connect: never read (see below), or dropped
                return f"reset ({type(err).__name__})"

        return send

    code, outcomes = sigterm_under_load(proc, client, lambda outcome: outcome == "rejected")
    answered = outcomes.count("answered")
    others = [o for o in outcomes if o not in ("answered", "rejected") and not o.startswith("reset")]
    assert code == 0
    assert answered >= 40
    assert others == [], others  # no error answers
    # The server's own count at exit: every request it read was answered, and the clients got every answer. A
    # reset after connect is then a connection the kernel queued but the server never read (safe to retry).
    assert process.exit_counts(proc) == {"200": answered}


def test_serve_cli_errors(tmp_path):
    missing = subprocess.run([sys.executable, "-m", "kiln", "serve", str(tmp_path / "nope")], capture_output=True,
                             text=True, timeout=60)
    assert missing.returncode == 1 and "does not exist" in missing.stderr
    bad = subprocess.run([sys.executable, "-m", "kiln", "serve", "--model", "noequals"], capture_output=True,
                         text=True, timeout=60)
    assert bad.returncode == 2 and "--model must be NAME=ARTIFACT" in bad.stderr


def test_a_request_whose_client_went_away_costs_no_compute(tiny_artifact):
    """A real uvicorn server (in a thread, so the engine can be gated): the vanished client's input never runs."""
    from kiln.serving.app import ServeConfig, create_app
    from kiln.serving.batcher import BatchLimits

    # One session, gated below: the second request must wait behind the first, not run on a second session.
    app = create_app(ServeConfig(models={"m": tiny_artifact}, limits=BatchLimits(max_delay_s=0.001), sessions=1))
    with process.serve_in_thread(app) as base:
        port = int(base.rsplit(":", 1)[1])
        predictor = app.state.models["m"].predictor
        release = threading.Event()
        engine = predictor.engine

        class Held:
            pad_multiple = 1

            def run(self, inputs):
                release.wait(timeout=30)
                return engine.run(inputs)

        predictor.engine = Held()

        def metric(name: str) -> float:
            line = next((x for x in httpx.get(f"{base}/metrics").text.splitlines() if x.startswith(name)), None)
            return float(line.split()[-1]) if line else 0.0

        def wait_for(name: str, value: float) -> None:
            wait_until(lambda: metric(name) >= value, f"{name} to reach {value}", poll=0.05)

        first = threading.Thread(target=httpx.post, args=(f"{base}/kiln/embed",), kwargs={"json": {"inputs": "held"},
                                                                                     "timeout": 60})
        first.start()
        wait_for("kiln_inflight_requests", 1)
        with socket.create_connection(("127.0.0.1", port)) as raw:  # send a request, then hang up
            body = b'{"inputs": "this client leaves before its answer"}'
            raw.sendall(b"POST /kiln/embed HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                        b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
            wait_for("kiln_inflight_requests", 2)
        wait_for('kiln_rejections_total{reason="client_gone"}', 1)
        release.set()
        first.join(timeout=60)
        assert metric("kiln_batch_size_count") == 1  # only the first request's batch ran
        assert metric('kiln_requests_total{route="/kiln/embed",status="499"}') == 1



def test_a_server_child_that_hangs_silently_or_dies_fails_its_start_at_once():
    """The start-up deadline holds without a line of output, and a child that exits is reported with its status."""
    import time

    began = time.monotonic()
    with pytest.raises(process.ServerStartError, match="did not start listening within 1 s"):
        process.start_server([sys.executable, "-c", "import time; time.sleep(60)"], timeout_s=1)
    assert time.monotonic() - began < 5
    began = time.monotonic()
    with pytest.raises(process.ServerStartError, match="exited with status 3 before listening"):
        process.start_server([sys.executable, "-c", "import sys; print('boom', file=sys.stderr); sys.exit(3)"])
    assert time.monotonic() - began < 5  # not the 120 s default deadline
    with pytest.raises(process.ServerStartError, match=r"killed by signal 9 \(SIGKILL\)"):
        process.start_server([sys.executable, "-c", "import os, signal; os.kill(os.getpid(), signal.SIGKILL)"])


def test_a_server_process_settles_its_heap_and_still_collects_cycles():
    # In a process of its own: settle_heap changes the whole interpreter's collector.
    script = """
import gc, weakref
from kiln.serving.heap import YOUNG_THRESHOLD, settle_heap
loaded = [[i] for i in range(50_000)]  # what a loaded server holds
settle_heap()
assert gc.get_freeze_count() >= 50_000, gc.get_freeze_count()
assert gc.get_threshold()[0] == YOUNG_THRESHOLD
class Node: pass
a, b = Node(), Node()
a.other, b.other = b, a
gone = weakref.ref(a)
del a, b
held = [[] for _ in range(YOUNG_THRESHOLD + 1_000)]  # net allocations past the threshold: a young collection
assert gone() is None, "a cycle made after settling was not collected"
print("ok")
"""
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0 and run.stdout.strip() == "ok", run.stderr
