"""OpenTelemetry: each served request is a span with tokenize, queue, batch, engine and postprocess children."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from kiln.serving.app import ServeConfig, create_app

pytest.importorskip("opentelemetry.sdk", reason="kiln[otel] is not installed")


def recording():
    """(an SDK tracer provider, the in-memory exporter it hands every finished span to)."""
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return provider, exporter


def test_a_request_is_a_span_with_a_child_per_stage(tiny_artifact):
    from opentelemetry.trace import SpanKind, StatusCode

    provider, exporter = recording()
    app = create_app(ServeConfig(models={"m": tiny_artifact}), tracer_provider=provider)
    with TestClient(app) as c:
        ok = c.post("/kiln/embed", json={"inputs": ["one text", "and another"]}, headers={"x-request-id": "trace-me"})
        bad = c.post("/kiln/embed", json={"inputs": ["x"], "dimensions": 100000})
    assert ok.status_code == 200 and bad.status_code == 422
    spans = exporter.get_finished_spans()
    roots = [s for s in spans if s.parent is None]
    assert [r.name for r in roots] == ["POST /kiln/embed", "POST /kiln/embed"]
    root = roots[0]
    assert root.kind == SpanKind.SERVER and root.attributes["kiln.request_id"] == "trace-me"
    assert root.attributes["kiln.model"] == "m" and root.attributes["http.response.status_code"] == 200
    children = sorted((s for s in spans if s.parent and s.parent.span_id == root.context.span_id),
                      key=lambda s: s.start_time)
    names = [s.name for s in children]
    assert names[0] == "tokenize" and names[-1] == "postprocess"
    assert {"queue", "batch", "engine"} <= set(names)
    for child in children:  # each stage lies inside the request, and stages follow one another
        assert root.start_time <= child.start_time <= child.end_time <= root.end_time
    engine = next(s for s in children if s.name == "engine")
    assert engine.attributes["kiln.batch_size"] == 2
    failed = roots[1]
    assert failed.attributes["http.response.status_code"] == 422 and failed.status.status_code != StatusCode.ERROR


def test_a_wall_clock_stepped_while_serving_keeps_each_stage_inside_its_request(tiny_artifact, monkeypatch):
    """Span times are wall-clock; the batcher's moments are perf_counter. A VM's clock corrected by 70 s after the
    server started (seen in a CI run) once put every stage 70 s before its request: the two clocks are now tied
    per request, not once per process."""
    import time

    import opentelemetry.sdk.trace as sdk_trace

    provider, exporter = recording()
    app = create_app(ServeConfig(models={"m": tiny_artifact}), tracer_provider=provider)
    with TestClient(app) as c:
        real = time.time_ns
        stepped = lambda: real() + 70 * 10**9  # noqa: E731 - the clock as the corrected VM reads it
        monkeypatch.setattr(time, "time_ns", stepped)
        monkeypatch.setattr(sdk_trace, "time_ns", stepped)
        assert c.post("/kiln/embed", json={"inputs": ["one text"]}).status_code == 200
    spans = exporter.get_finished_spans()
    (root,) = [s for s in spans if s.parent is None]
    children = [s for s in spans if s.parent and s.parent.span_id == root.context.span_id]
    assert {"tokenize", "queue", "batch", "engine", "postprocess"} <= {s.name for s in children}
    for child in children:
        assert root.start_time <= child.start_time <= child.end_time <= root.end_time, child.name


def test_otlp_endpoint_without_the_extra_names_the_install(monkeypatch):
    import builtins

    from kiln.errors import MissingDependencyError
    from kiln.serving.tracing import tracer_provider

    real = builtins.__import__

    def blocked(name, *args, **kwargs):
        if name.startswith("opentelemetry.exporter"):
            raise ImportError(f"No module named {name!r}")
        return real(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", blocked)
    with pytest.raises(MissingDependencyError, match=r"pip install 'kiln\[otel\]'"):
        tracer_provider("http://127.0.0.1:4318")


def test_a_request_with_a_traceparent_joins_the_callers_trace(tiny_artifact):
    provider, exporter = recording()
    trace_id, parent_id = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
    with TestClient(create_app(ServeConfig(models={"m": tiny_artifact}), tracer_provider=provider)) as c:
        assert c.post("/kiln/embed", json={"inputs": "joined"},
                      headers={"traceparent": f"00-{trace_id}-{parent_id}-01"}).status_code == 200
        assert c.post("/kiln/embed", json={"inputs": "alone"}).status_code == 200
    joined, alone = sorted((s for s in exporter.get_finished_spans() if s.name == "POST /kiln/embed"),
                           key=lambda s: s.start_time)
    assert f"{joined.context.trace_id:032x}" == trace_id and f"{joined.parent.span_id:016x}" == parent_id
    assert alone.parent is None and alone.context.trace_id != joined.context.trace_id  # no context leaks over


def test_a_global_provider_gets_kilns_spans_and_only_those(tiny_artifact, monkeypatch):
    """As under opentelemetry-instrument: no --otlp-endpoint, a configured global provider. kiln records its own
    request span there, and FastAPI's native telemetry (0.165+) adds no second SERVER span per request."""
    from opentelemetry import trace
    from opentelemetry.trace import SpanKind

    provider, exporter = recording()
    monkeypatch.setattr(trace, "get_tracer_provider", lambda: provider)
    with TestClient(create_app(ServeConfig(models={"m": tiny_artifact}))) as c:
        assert c.post("/kiln/embed", json={"inputs": "one"}).status_code == 200
    servers = [s for s in exporter.get_finished_spans() if s.kind == SpanKind.SERVER]
    assert [(s.name, s.attributes.get("kiln.model")) for s in servers] == [("POST /kiln/embed", "m")]


def test_a_generation_request_is_a_span_too(tiny_model, tmp_path):
    from kiln.choices import ExportFormat
    from kiln.exporting.job import ExportConfig, run_export
    from kiln.tasks import TaskName

    art = tmp_path / "gpt2"
    run_export(ExportConfig(model=str(tiny_model("gpt2", TaskName.TEXT_GENERATION)), task=TaskName.TEXT_GENERATION,
                            format=ExportFormat.ONNX, output=art))
    provider, exporter = recording()
    with TestClient(create_app(ServeConfig(models={"g": art}), tracer_provider=provider)) as c:
        assert c.post("/generate", json={"inputs": "Once", "max_new_tokens": 4}).status_code == 200
    (span,) = exporter.get_finished_spans()
    assert span.name == "POST /generate" and span.attributes["kiln.task"] == "text-generation"
