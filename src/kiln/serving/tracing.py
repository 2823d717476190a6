"""OpenTelemetry spans for served requests (optional: ``pip install 'kiln[otel]'``; ``--otlp-endpoint``, or a
global tracer provider the process already has, as ``opentelemetry-instrument`` sets one).

Each inference request is one SERVER span named after its route, with child spans for what it waited on and ran:
``tokenize``, then per batch that held its inputs ``queue`` (arrival until its batch was formed), ``batch``
(formed until a session took it: collation and waiting for a free engine) and ``engine`` (the forward pass and
pooling, shared with the batch's other requests: ``kiln.batch_size`` says how many), then ``postprocess``.
The batcher records those moments with ``time.perf_counter``; they are turned into span times here.

A request that carries a W3C ``traceparent`` header continues the caller's trace (:class:`TraceContext`). These are
the server's only request spans: FastAPI's own native telemetry (0.165+) is turned off in kiln.serving.app, else a
process with a global provider would get a second, bare SERVER span per request beside kiln's.

Without a tracer every call below is a no-op on :data:`NO_TRACE`, so the request path never asks whether
tracing is on.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from typing import Any

from kiln.errors import missing_dependency
from kiln.serving.guard import ASGIApp, Receive, Scope, Send


class RequestTrace:
    """The spans of one request (a root and its children)."""

    def __init__(self, tracer: Any, root: Any) -> None:
        self._tracer, self.root = tracer, root
        from opentelemetry.trace import set_span_in_context

        self._context = set_span_in_context(root)
        # perf_counter -> wall-clock nanoseconds (OpenTelemetry's span times), taken as the root starts: the wall
        # clock may be stepped or slewed while a server runs (a VM's clock was corrected by 70 s between a test
        # server's start and its request, and a stage then began 70 s before its request), perf_counter is not.
        self._offset_ns = time.time_ns() - int(time.perf_counter() * 1e9)

    def _ns(self, perf: float) -> int:
        return self._offset_ns + int(perf * 1e9)

    def child(self, name: str, start: float, end: float, **attributes: Any) -> None:
        """A finished child span from ``start`` to ``end`` (perf_counter seconds)."""
        span = self._tracer.start_span(name, context=self._context, start_time=self._ns(start),
                                       attributes={f"kiln.{k}": v for k, v in attributes.items()})
        span.end(end_time=self._ns(end))

    def set(self, **attributes: Any) -> None:
        self.root.set_attributes({f"kiln.{k}": v for k, v in attributes.items()})


class _NoTrace:
    def child(self, name: str, start: float, end: float, **attributes: Any) -> None:
        pass

    def set(self, **attributes: Any) -> None:
        pass


NO_TRACE: Any = _NoTrace()


class Tracing:
    """Starts a :class:`RequestTrace` per request on ``tracer`` (None: tracing off, every trace is NO_TRACE)."""

    def __init__(self, tracer: Any = None) -> None:
        self.tracer = tracer

    @contextlib.contextmanager
    def request(self, route: str, **attributes: Any) -> Iterator[Any]:
        if self.tracer is None:
            yield NO_TRACE
            return
        from opentelemetry.trace import SpanKind, Status, StatusCode

        root = self.tracer.start_span(f"POST {route}", kind=SpanKind.SERVER, attributes={
            "http.route": route, **{f"kiln.{k}": v for k, v in attributes.items() if v is not None}})
        try:
            yield RequestTrace(self.tracer, root)
        except Exception as err:
            status = getattr(err, "status", 500)
            root.set_attribute("http.response.status_code", status)
            if status >= 500:
                root.record_exception(err)
                root.set_status(Status(StatusCode.ERROR, str(err)))
            raise
        else:
            root.set_attribute("http.response.status_code", 200)
        finally:
            root.end()


def tracer_provider(endpoint: str, service_name: str = "kiln") -> Any:
    """A TracerProvider exporting to an OTLP/HTTP collector at ``endpoint`` (e.g. http://collector:4318)."""
    try:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
    except ImportError as err:
        raise missing_dependency("opentelemetry-sdk", "otel", err) from err
    provider = TracerProvider(resource=Resource.create({"service.name": service_name}))
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=f"{endpoint.rstrip('/')}/v1/traces")))
    return provider


def global_provider() -> Any:
    """The process's global tracer provider when one has been configured (``opentelemetry-instrument``, or the
    application's own SDK set-up), else None: the API's default proxy and no-op providers record nothing."""
    try:
        from opentelemetry import trace
    except ImportError:
        return None
    provider = trace.get_tracer_provider()
    return None if isinstance(provider, (trace.ProxyTracerProvider, trace.NoOpTracerProvider)) else provider


class TraceContext:
    """Plain ASGI, mounted only while tracing is on: the caller's trace context (W3C ``traceparent`` and
    ``tracestate`` headers, through OpenTelemetry's configured propagator) is made current for the request, so the
    request's span (started with no explicit parent) joins the caller's trace."""

    def __init__(self, app: ASGIApp) -> None:
        from opentelemetry import context, propagate

        self.app, self._context, self._propagate = app, context, propagate

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        carrier = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        token = self._context.attach(self._propagate.extract(carrier))
        try:
            await self.app(scope, receive, send)
        finally:
            self._context.detach(token)
