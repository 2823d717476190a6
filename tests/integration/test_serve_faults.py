"""Injected faults in kiln serve: each must end in a 500 JSON answer (never a hang), a log line with the request id,
/ready and /metrics telling the truth, and other requests unharmed."""

from __future__ import annotations

import io
import json
import logging
import threading

import pytest
from fastapi.testclient import TestClient

from kiln import log as kiln_log
from kiln.serving import batcher as batcher_module
from kiln.serving.app import ServeConfig, create_app
from kiln.serving.batcher import BatchLimits
from tests.waiting import concurrently, wait_until


class Faulty:
    """Wraps an engine: raises on chosen calls, can hold each call until released, counts calls."""

    def __init__(self, engine, fail_calls=(), fail_pad=False) -> None:
        self.engine, self.fail_calls, self.calls = engine, set(fail_calls), 0
        self.release, self.started = threading.Event(), threading.Event()
        self.release.set()
        self.fail_pad = fail_pad

    @property
    def pad_multiple(self) -> int:  # read while a batch is collated, outside the engine call
        if self.fail_pad:
            raise RuntimeError("injected: pad_multiple unreadable")
        return 1

    def run(self, inputs):
        self.calls += 1
        self.started.set()
        self.release.wait(timeout=30)
        if self.calls in self.fail_calls:
            raise RuntimeError(f"injected engine failure on call {self.calls}")
        return self.engine.run(inputs)


@pytest.fixture
def served(tiny_artifact):
    """(client, served model, the app) with the app's lifespan running; restart_loops per test via indirect."""

    def make(max_delay_s: float = 0.001, **config):
        # One session: the faults are injected into its engine and its batches (a server's default is a session per
        # core, and a batch on another session would dodge the fault).
        config.setdefault("sessions", 1)
        return create_app(ServeConfig(models={"m": tiny_artifact}, limits=BatchLimits(max_delay_s=max_delay_s),
                                      **config))

    return make


def metric(client: TestClient, name: str) -> float:
    for line in client.get("/metrics").text.splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            return float(line.split()[-1])
    return 0.0


def test_an_engine_error_fails_only_its_batch_with_a_logged_500(served, caplog):
    app = served()
    with TestClient(app) as c, caplog.at_level(logging.ERROR, logger="kiln"):
        model = app.state.models["m"]
        model.predictor.engine = Faulty(model.predictor.engine, fail_calls={1})
        bad = c.post("/kiln/embed", json={"inputs": "first"}, headers={"x-request-id": "req-42"})
        good = c.post("/kiln/embed", json={"inputs": "second"})
        ready = c.get("/ready")
    assert bad.status_code == 500 and bad.json()["error"]["type"] == "inference_failed"
    assert "injected engine failure" in bad.json()["error"]["message"]
    assert bad.headers["x-request-id"] == "req-42"
    assert good.status_code == 200 and len(good.headers["x-request-id"]) == 32  # generated when not sent
    assert ready.status_code == 200
    batch_line = next(r for r in caplog.records if "batch of 1 inputs failed" in r.getMessage())
    assert "req-42" in batch_line.getMessage() and batch_line.exc_info
    http_line = next(r for r in caplog.records if r.name == "kiln.serve.http")
    assert http_line.request_id == "req-42" and "-> 500" in http_line.getMessage()


def test_a_collation_error_outside_the_engine_call_fails_only_its_batch(served):
    app = served()
    with TestClient(app) as c:
        model = app.state.models["m"]
        engine = model.predictor.engine
        model.predictor.engine = Faulty(engine, fail_pad=True)
        bad = c.post("/kiln/embed", json={"inputs": "x"})
        model.predictor.engine = engine
        good = c.post("/kiln/embed", json={"inputs": "y"})
    assert bad.status_code == 500 and "pad_multiple unreadable" in bad.json()["error"]["message"]
    assert good.status_code == 200


def test_a_tokenizer_error_on_one_input_fails_that_request_alone(served):
    app = served()
    with TestClient(app) as c:
        model = app.state.models["m"]
        features = model.predictor.handler.features

        def poisoned(inputs, encoder, options):
            if any("poison" in str(i) for i in inputs):
                raise ValueError("injected tokenizer failure")
            return features(inputs, encoder, options)

        model.predictor.handler.features = poisoned
        try:
            texts = ["a", "poison", "b", "c"]
            answers = concurrently([lambda t=t: c.post("/kiln/embed", json={"inputs": t}) for t in texts],
                                   "requests beside a poisoned one")
        finally:
            del model.predictor.handler.features
    assert [a.status_code for a in answers] == [200, 500, 200, 200]
    assert answers[1].json()["error"]["type"] == "preprocessing_failed"


def _kill_the_loop_while_requests_wait(app, c):
    """Hold the engine with one request, queue three more, then make the loop's partition search raise: the loop
    dies with the three queued (the app waits 0.3 s before forming a batch while the engine is busy, so the three
    are queued together). Returns (held answer, queued answers)."""
    model = app.state.models["m"]
    engine = Faulty(model.predictor.engine)
    engine.release.clear()
    model.predictor.engine = engine
    original = batcher_module.partition
    held: list = []
    first = threading.Thread(target=lambda: held.append(c.post("/kiln/embed", json={"inputs": "held"})), daemon=True)
    first.start()
    assert engine.started.wait(10), "the first request never reached the engine"

    def broken(lengths, limits):
        raise RuntimeError("injected: the partition search failed")

    batcher_module.partition = broken
    try:
        answers = concurrently([lambda i=i: c.post("/kiln/embed", json={"inputs": f"queued {i}"}) for i in range(3)],
                               "queued requests of a dead loop to be answered")
    finally:
        batcher_module.partition = original
        engine.release.set()
    first.join(20)
    assert held, "the request on the engine was never answered"
    return held[0], answers


def test_a_dead_batching_loop_fails_queued_requests_turns_ready_off_and_is_counted(served, caplog):
    app = served(max_delay_s=0.3)
    with TestClient(app) as c, caplog.at_level(logging.ERROR, logger="kiln"):
        held, queued = _kill_the_loop_while_requests_wait(app, c)
        ready = c.get("/ready")
        later = c.post("/kiln/embed", json={"inputs": "after"})
        deaths = metric(c, "kiln_loop_deaths_total")
        gauge = metric(c, "kiln_model_ready")
    assert held.status_code == 200  # its batch was already on the engine
    assert [q.status_code for q in queued] == [500, 500, 500]
    assert all("batcher loop died" in q.json()["error"]["message"] for q in queued)
    assert ready.status_code == 503 and "batcher loop of model 'm' died" in ready.json()["error"]["message"]
    assert later.status_code == 503
    assert deaths == 1 and gauge == 0
    assert any("the batcher loop died" in r.getMessage() and r.exc_info for r in caplog.records)


def test_restart_loops_brings_a_dead_loop_back(served):
    app = served(max_delay_s=0.3, restart_loops=True)
    with TestClient(app) as c:
        held, queued = _kill_the_loop_while_requests_wait(app, c)
        wait_until(lambda: c.get("/ready").status_code == 200, "/ready after the restart", timeout=10)
        later = c.post("/kiln/embed", json={"inputs": "after"})
        restarts, deaths = metric(c, "kiln_loop_restarts_total"), metric(c, "kiln_loop_deaths_total")
    assert [q.status_code for q in queued] == [500, 500, 500]
    assert later.status_code == 200 and restarts == deaths == 1


def test_json_logs_carry_the_request_id_and_uvicorn_access_lines_share_the_format():
    stream = io.StringIO()
    saved = {n: (logging.getLogger(n).handlers[:], logging.getLogger(n).propagate, logging.getLogger(n).level)
             for n in (kiln_log.ROOT, *kiln_log.UVICORN_LOGGERS)}
    try:
        kiln_log.configure("json", stream=stream)
        token = kiln_log.request_id.set("abc-1")
        kiln_log.get_logger("serve").error("boom %d", 7, extra={"status": 500})
        kiln_log.request_id.reset(token)
        logging.getLogger("uvicorn.access").info('%s - "%s %s HTTP/%s" %d', "127.0.0.1:5", "POST", "/kiln/embed", "1.1",
                                                 200)
        with pytest.raises(Exception, match="log_format must be one of: text, json"):
            kiln_log.configure("yaml")
    finally:
        for name, (handlers, propagate, level) in saved.items():
            logger = logging.getLogger(name)
            logger.handlers[:] = handlers
            logger.propagate, logger.level = propagate, level
    first, second = (json.loads(line) for line in stream.getvalue().splitlines())
    assert first["message"] == "boom 7" and first["request_id"] == "abc-1" and first["status"] == 500
    assert first["logger"] == "kiln.serve" and first["level"] == "error"
    assert second["logger"] == "uvicorn.access" and second["path"] == "/kiln/embed" and second["status"] == 200


def test_the_text_format_leaves_the_record_as_it_was_logged():
    """uvicorn's access record reaches other handlers with its own message and args after kiln formats it."""
    record = logging.LogRecord("uvicorn.access", logging.INFO, __file__, 1, '%s - "%s %s HTTP/%s" %d',
                               ("127.0.0.1:5", "POST", "/embed", "1.1", 200), None)
    line = kiln_log.TextFormatter().format(record)
    assert line.endswith("uvicorn.access 127.0.0.1:5 POST /embed -> 200")
    assert record.getMessage() == '127.0.0.1:5 - "POST /embed HTTP/1.1" 200' and not hasattr(record, "rid")


def test_over_its_memory_budget_the_server_refuses_new_work_with_503(tiny_artifact):
    """Fault injection: a --max-memory budget below what the process holds. New requests get 503 with the figures
    and Retry-After, in each protocol's error shape, counted as rejections; under the budget they are answered."""
    import subprocess
    import sys

    from kiln.serving.admission import Admission, memory_budget
    from kiln.serving.metrics import Metrics
    from kiln.system.memory import cgroup_memory_limit, resident_bytes

    assert resident_bytes() > 50 * 1024**2  # this process: Python, numpy, ONNX Runtime
    for budget, status in ((1024**2, 503), (1024**4, 200)):
        app = create_app(ServeConfig(models={"m": tiny_artifact}, max_memory=budget))
        with TestClient(app) as c:
            answer = c.post("/kiln/embed", json={"inputs": "a text"})
            tei = c.post("/embed", json={"inputs": "a text"})
            scraped = c.get("/metrics").text
        assert answer.status_code == tei.status_code == status, answer.text
        if status == 503:
            message = answer.json()["error"]["message"]
            assert message.startswith("memory: the server holds ") and "over its --max-memory budget of 0.00 GiB" \
                in message and answer.headers["retry-after"] == "1"
            assert tei.json()["error_type"] == "Overloaded" and tei.json()["error"] == message
            assert 'kiln_rejections_total{reason="memory"} 2.0' in scraped
    # the budget is checked per request, against what the process holds then
    held = iter([10, 30, 10])
    admission = Admission(4, Metrics(), memory=20, resident=lambda: next(held))
    assert [admission.enter(), admission.enter(), admission.enter()] == [True, False, True]
    assert admission.inflight == 2
    assert memory_budget("8GiB") == 8 * 1024**3 and memory_budget("512MB") == 512 * 1000**2
    assert memory_budget("none") is None and memory_budget(None) is None
    limit = cgroup_memory_limit()
    assert memory_budget("auto") == (int(limit * 0.9) if limit is not None else None)
    refused = subprocess.run([sys.executable, "-m", "kiln", "serve", str(tiny_artifact), "--max-memory", "lots"],
                             capture_output=True, text=True, timeout=120)
    assert refused.returncode == 2 and "--max-memory must be a size such as 8GiB" in refused.stderr, refused.stderr
