"""The ASGI app: the served tasks' routes (declared by each task's wire part), probes, metrics, one error table.

Only the routes of the tasks being served are mounted, and the OpenAPI schema is made exact for this server:
the inputs' ``maxItems`` is --max-inputs-per-request, ``model`` lists the served names, every error is modelled.
"""

from __future__ import annotations

import inspect
import json
import re
import time
from collections.abc import Mapping
from contextlib import asynccontextmanager
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import orjson
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.openapi.utils import get_openapi
from fastapi.responses import HTMLResponse, PlainTextResponse
from prometheus_client import generate_latest
from starlette.exceptions import HTTPException as StarletteHTTPException

from kiln.artifact.manifest import read_manifest
from kiln.choices import KILN_PREFIX, Device, WireProtocol
from kiln.errors import KilnError, UsageError
from kiln.log import get_logger
from kiln.serving import generation, playground, tei, tracing
from kiln.serving.admission import Admission
from kiln.serving.batcher import BatchLimits
from kiln.serving.coalesce import CoalescingPool
from kiln.serving.endpoints import HTTPError, JSONBody, error_content, not_ready, picked, post_endpoint
from kiln.serving.fastlane import FastLane
from kiln.serving.guard import Guard
from kiln.serving.inference import Served, infer, load_served
from kiln.serving.metrics import STOPPED, Metrics
from kiln.serving.request_id import RequestId
from kiln.serving.schemas import (
    ERRORS_BY_PROTOCOL,
    INFERENCE_ERRORS,
    ErrorBody,
    Health,
    Info,
    ModelCard,
    ModelList,
    Ready,
)
from kiln.serving.shadow import ShadowConfig
from kiln.tasks.wire import task_wire
from kiln.tasks.wire.http import Route, kiln_path

LATENCY_HEADER = "x-kiln-latency-ms"
log = get_logger("serve")
# FastAPI 0.165+ records its own OpenTelemetry spans, metrics and logs per request wherever the process has global
# providers; kiln's request spans (kiln.serving.tracing), Prometheus metrics and logs are the server's own, so FastAPI's
# are off: no second span per request, and no per-request check of three global providers on the event loop.
_NATIVE_TELEMETRY_OFF = ({"telemetry": {"tracing": False, "metrics": False, "logs": False}}
                         if "telemetry" in inspect.signature(FastAPI.__init__).parameters else {})
PROTOCOLS = tuple(WireProtocol)  # --protocols' default: every API (TEI's body on a path TEI defines; kiln's at /kiln/)
V2_INFER = re.compile(r"^/v2/models/[^/]+(/versions/[^/]+)?/infer$")


@dataclass(frozen=True)
class ServeConfig:
    models: dict[str, Path]  # name -> artifact directory
    limits: BatchLimits = BatchLimits()
    max_concurrent: int = 512
    max_memory: int | None = None  # resident bytes past which new work gets 503 (--max-memory); None: no budget
    api_key: str | None = None
    max_body_bytes: int = 2 * 1024 * 1024
    threads: int | None = None  # per session; None: the artifact's serving default, else the runtime's
    sessions: int | None = None  # engine instances running batches side by side; None: serving default, else 1
    tokenizer_threads: int = 2
    max_inputs_per_request: int = 64  # like TEI's --max-client-batch-size; 413 above it
    restart_loops: bool = False  # a batcher/decode loop that dies is restarted (its queued requests still fail)
    otlp_endpoint: str | None = None  # OpenTelemetry collector (OTLP/HTTP) for request spans; needs kiln[otel]
    deterministic: bool = False  # serve only batch-invariant variants (kiln optimize measured their drift)
    variants: Mapping[str, str] = field(default_factory=dict)  # model name -> the variant served (--variant)
    shadow: ShadowConfig | None = None  # live agreement against the fp32 reference (--shadow-rate)
    protocols: tuple[WireProtocol, ...] = PROTOCOLS  # the APIs served (--protocols)
    grpc_port: int | None = None  # the v2 gRPC service's port (--grpc-port); None: no gRPC
    device: Device = Device.CPU  # where the engines run (--device): cuda/tensorrt are ONNX Runtime's GPU providers
    fast_lane: bool = True  # valid inference bodies skip FastAPI's routing (kiln.serving.fastlane); tests compare

    def __post_init__(self) -> None:
        object.__setattr__(self, "protocols", tuple(WireProtocol(p) for p in self.protocols))
        if not self.protocols:
            raise UsageError(f"protocols needs at least one of {', '.join(p.value for p in WireProtocol)}")
        if self.grpc_port is not None and WireProtocol.V2 not in self.protocols:
            raise UsageError("grpc_port serves the v2 protocol over gRPC: add v2 to --protocols")
        if unknown := sorted(set(self.variants) - set(self.models)):
            raise UsageError(f"variant names models not served: {', '.join(unknown)} (served: "
                             f"{', '.join(self.models)})")


def create_app(config: ServeConfig, tracer_provider: Any = None) -> FastAPI:
    """The server for ``config.models``: routes of their tasks, probes, metrics, errors as JSON. Request spans go
    to ``tracer_provider`` when given (tests pass one with an in-memory exporter), else to an OTLP exporter at
    ``config.otlp_endpoint`` when set."""
    manifests = {name: read_manifest(Path(path).expanduser()) for name, path in config.models.items()}
    configs = {name: m.task for name, m in manifests.items()}
    tasks = {name: c.task for name, c in configs.items()}
    app = FastAPI(title="kiln", lifespan=_lifespan, description="Dynamic-batching inference for a kiln artifact.",
                  default_response_class=JSONBody, **_NATIVE_TELEMETRY_OFF)
    app.state.config, app.state.tasks, app.state.models, app.state.metrics = config, tasks, {}, Metrics()
    app.state.admission = Admission(config.max_concurrent, app.state.metrics, config.max_memory)  # HTTP's and gRPC's
    app.state.task_configs = configs
    # Which models can quantize to int8/uint8 (their artifact stores output calibration): the schema says so.
    app.state.calibrated = {name: m.build.output_calibration is not None for name, m in manifests.items()}
    if tracer_provider is None:
        tracer_provider = (tracing.tracer_provider(config.otlp_endpoint) if config.otlp_endpoint
                           else tracing.global_provider())
    app.state.tracing = tracing.Tracing(tracer_provider.get_tracer("kiln.serve") if tracer_provider else None)
    app.state.pool = CoalescingPool(max_workers=config.tokenizer_threads, thread_name_prefix="kiln-tokenize")
    app.state.playground = playground.page(tasks)
    served = _served_routes(tasks, config.protocols)
    aliases = _aliases(tasks, config.protocols, {r.path for r, _ in served})
    # Which served models answer each route: fixed once the artifacts are known, read on every request.
    app.state.route_models = {r.path: _doing(tasks, own) for r, own in served} | {a.path: _doing(tasks, r)[:1]
                                                                                 for a, r in aliases}
    routes = [r for r, _ in served] + [alias for alias, _ in aliases]
    app.state.path_protocols = {r.path: r.protocol for r in routes}
    app.state.fast_routes = {}  # path -> (request model, endpoint): what the fast lane may answer itself
    for route in routes:
        MOUNTS[route.kind](app, route)
    _mount_probes(app, kiln_info=WireProtocol.KILN in config.protocols, bare_info=not tei.serves_info(config.protocols))
    if WireProtocol.TEI in config.protocols:
        tei.mount(app, info=tei.serves_info(config.protocols))
        app.state.path_protocols.update({path: WireProtocol.TEI for path in tei.SERVER_PATHS})
    if WireProtocol.V2 in config.protocols:
        from kiln.serving.v2 import http as v2_http

        v2_http.mount(app)
    _install_error_handlers(app)
    task_paths = {r.path for r in routes} | (set(tei.SERVER_PATHS) if WireProtocol.TEI in config.protocols else set())
    serves_v2 = WireProtocol.V2 in config.protocols

    def route_of(path: str) -> str | None:
        """The label an inference path is counted under, or None for a path the guard leaves alone."""
        if path in task_paths:
            return path
        return "/v2/models/{name}/infer" if serves_v2 and V2_INFER.match(path) else None

    if config.fast_lane:
        app.add_middleware(FastLane, fastapi=app)  # inside the guard: admission control and ids stay as they are
    app.add_middleware(Guard, route_of=route_of, metrics=app.state.metrics, api_key=config.api_key,
                       max_body_bytes=config.max_body_bytes, admission=app.state.admission,
                       error=lambda path, kind, message: orjson.dumps(error_content(_protocol_of(app, path), kind,
                                                                                    message)))
    if tracer_provider is not None:  # inside the ids, around the fast lane: a request's span joins the caller's trace
        app.add_middleware(tracing.TraceContext)
    app.add_middleware(RequestId)  # outermost: the id is set for the guard's refusals and echoed on every answer
    app.openapi = lambda: _exact_openapi(app, routes)  # type: ignore[method-assign]
    return app


@asynccontextmanager
async def _lifespan(app: FastAPI):
    """Load and warm every model, serve, then finish every accepted request and log the final counts."""
    state, config = app.state, app.state.config
    for name, path in config.models.items():
        state.models[name] = load_served(name, Path(path), config.limits, state.metrics, threads=config.threads,
                                         sessions=config.sessions, deterministic=config.deterministic,
                                         shadow=config.shadow, device=config.device,
                                         variant=config.variants.get(name))
        state.models[name].set_ready(False, state.metrics)
    for served in state.models.values():
        served.start(state.metrics, restart=config.restart_loops)
        await served.scheduler.warmup()
        served.set_ready(True, state.metrics)
    grpc_server = None
    if config.grpc_port is not None:
        from kiln.serving.v2 import grpc as v2_grpc

        grpc_server = await v2_grpc.start(app, config.grpc_port)
    yield
    if grpc_server is not None:  # drain: new RPCs are refused, those in flight finish
        await v2_grpc.stop(grpc_server)
    for served in state.models.values():
        served.set_ready(False, state.metrics, "the server is shutting down")
        await served.close()
    state.pool.shutdown(wait=True)
    counts = state.metrics.status_counts()  # uvicorn has sent every response by now: these are final
    log.info(f"{STOPPED} %d inference requests, by status: %s", sum(counts.values()),
             json.dumps(counts, sort_keys=True))


def _served_routes(tasks: dict[str, str], protocols: tuple[WireProtocol, ...]) -> list[tuple[Route, Route]]:
    """(served route, the task's route) for each route of the served tasks in the served protocols, once (several
    models of one task share its routes). kiln's own routes are served under KILN_PREFIX, and at their own path
    where no served TEI route has it: where kiln's and TEI's share a path (/embed, /rerank, /embed_sparse) their
    answers differ and a request cannot say which it wants, so the path answers as TEI defines it and a TEI client
    works against kiln serve's defaults; kiln's clients ask /kiln/embed."""
    routes: dict[str, tuple[Route, Route]] = {}
    for task in dict.fromkeys(tasks.values()):
        for route in task_wire(task).routes:
            if route.protocol not in protocols:
                continue
            if route.protocol is WireProtocol.KILN:
                routes.setdefault(kiln_path(route), (replace(route, path=kiln_path(route)), route))
            held = routes.get(route.path)
            if held is None or (held[0].protocol is WireProtocol.KILN and route.protocol is WireProtocol.TEI):
                routes[route.path] = (route, route)
    return list(routes.values())


def _doing(tasks: dict[str, str], route: Route) -> list[str]:
    """The served models whose task declares ``route``."""
    return [name for name, task in tasks.items() if route in task_wire(task).routes]


# Paths text-embeddings-inference also routes (router/src/http/server.rs): POST / and SageMaker's /invocations run
# its one model's own route, chosen by the model's type; /embeddings is OpenAI's /v1/embeddings.
TEI_DEFAULT_PATHS = ("/", "/invocations")
OPENAI_ALIASES = {"/embeddings": "/v1/embeddings"}


def _aliases(tasks: dict[str, str], protocols: tuple[WireProtocol, ...], taken: set[str]) -> list[tuple[Route, Route]]:
    """(alias, route) pairs: each alias answers exactly as its route, for the first served model that has it (TEI
    serves one model; huggingface_hub's ``InferenceClient(base_url=...)`` posts to /). The route of POST / is the
    first served model's TEI route, as TEI's own server does."""
    out: list[tuple[Route, Route]] = []
    if WireProtocol.TEI in protocols:
        tei_route = next((r for task in tasks.values() for r in task_wire(task).routes
                          if r.protocol is WireProtocol.TEI), None)
        if tei_route is not None:
            out += [(replace(tei_route, path=path), tei_route) for path in TEI_DEFAULT_PATHS]
    if WireProtocol.OPENAI in protocols:
        for alias, path in OPENAI_ALIASES.items():
            route = next((r for task in tasks.values() for r in task_wire(task).routes
                          if r.path == path and r.protocol is WireProtocol.OPENAI), None)
            if route is not None and alias not in taken:
                out.append((replace(route, path=alias), route))
    return out


def _protocol_of(app: FastAPI, path: str) -> WireProtocol:
    """The API a path belongs to, for its errors' shape: a mounted route's own, else v2's under /v2/."""
    if path in app.state.path_protocols:  # Cohere's /v2/rerank is not the v2 protocol's
        return app.state.path_protocols[path]
    if path == "/v2" or path.startswith("/v2/"):
        return WireProtocol.V2
    protocols = app.state.config.protocols
    # Elsewhere (an unknown path, the probes): kiln's shape, or TEI's where kiln's API is not served.
    return WireProtocol.TEI if WireProtocol.TEI in protocols and WireProtocol.KILN not in protocols \
        else WireProtocol.KILN


def _mount_route(app: FastAPI, route: Route) -> None:
    async def endpoint(body: Any) -> JSONBody:
        start = time.perf_counter()
        with picked(app, body.model, route) as (served, trace):
            prepared, results = await infer(served, body, app.state.pool, app.state.metrics,
                                            app.state.config.max_inputs_per_request, trace)
            answer = route.render(body, served.name, prepared, results)
        # Server-side time (tokenize, queue, run, post-process), for clients and the playground page.
        latency = {LATENCY_HEADER: f"{1000 * (time.perf_counter() - start):.2f}"}
        return JSONBody(answer, headers=latency)

    post_endpoint(app, route, endpoint, ERRORS_BY_PROTOCOL.get(route.protocol, INFERENCE_ERRORS))
    app.state.fast_routes[route.path] = (route.request, endpoint)


# Route kind (tasks.http.Route.kind) -> how it is mounted.
MOUNTS = {"infer": _mount_route, "generate": generation.mount_route}


def _mount_probes(app: FastAPI, *, kiln_info: bool = True, bare_info: bool = True) -> None:
    """The probes, the playground, /metrics and OpenAI's model list; kiln's /info at /kiln/info where kiln's API is
    served (``kiln_info``), and at /info too unless TEI's /info holds it (``bare_info``)."""
    unready_doc = {503: {"model": ErrorBody, "description": "The model is still loading, is shutting down, or its "
                       "batching loop died (the message says which)."}}

    @app.get("/", response_class=HTMLResponse, summary="The playground page (a form per served task)",
             responses={200: {"content": {"text/html": {"schema": {"type": "string"}}}}})
    async def playground():
        return HTMLResponse(app.state.playground)

    @app.get("/health", response_model=Health)
    async def health():
        return {"status": "ok"}

    @app.get("/ping", response_model=Health, summary="Health (SageMaker's probe path, as TEI serves it)")
    async def ping():
        return {"status": "ok"}

    @app.get("/ready", response_model=Ready, responses=unready_doc)
    async def ready():
        models: dict[str, Served] = app.state.models
        error = not_ready(models, probe=True)
        if error is not None:
            raise error
        return {"ready": True, "models": list(models)}

    async def info():
        config: ServeConfig = app.state.config
        return {"models": [m.describe() for m in app.state.models.values()],
                "limits": {**asdict(config.limits), "max_concurrent": config.max_concurrent,
                           "max_body_bytes": config.max_body_bytes,
                           "max_inputs_per_request": config.max_inputs_per_request}}

    for path in ((KILN_PREFIX + "/info",) if kiln_info else ()) + (("/info",) if bare_info else ()):
        app.get(path, response_model=Info, summary="Served models and limits (kiln's API)")(info)

    @app.get("/v1/models", response_model=ModelList)
    async def openai_models():
        return {"object": "list", "data": [ModelCard(id=n, object="model", created=0, owned_by="kiln").model_dump()
                                           for n in app.state.models]}

    @app.get("/metrics", response_class=PlainTextResponse,
             responses={200: {"content": {"text/plain": {"schema": {"type": "string"}}}}})
    async def prometheus():
        return PlainTextResponse(generate_latest(app.state.metrics.registry).decode(),
                                 media_type="text/plain; version=0.0.4")


def _install_error_handlers(app: FastAPI) -> None:
    """One table from exceptions to statuses; every error body is in the shape of the path's protocol (kiln's
    ErrorBody, TEI's ErrorResponse, v2's {"error": message}), never a traceback."""

    def _error(request: Request, status: int, kind: str, message: str,
               headers: dict[str, str] | None = None) -> JSONBody:
        protocol = _protocol_of(app, request.url.path)
        if protocol is WireProtocol.V2 and status == 422:
            status = 400  # the protocol's answer to a bad request
        return JSONBody(error_content(protocol, kind, message), status_code=status, headers=headers)

    @app.exception_handler(HTTPError)
    async def _http_error(request: Request, exc: HTTPError):
        return _error(request, exc.status, exc.kind, exc.message, exc.headers)

    @app.exception_handler(StarletteHTTPException)
    async def _starlette(request: Request, exc: StarletteHTTPException):  # unknown path, wrong method, bad JSON
        if exc.status_code == 400:  # FastAPI's "error parsing the body": the body is not JSON
            return _error(request, 422, "validation_error", f"body: not valid JSON ({exc.detail})")
        paths = sorted({r.path for r in app.routes if hasattr(r, "methods")})
        message = f"{request.method} {request.url.path}: {exc.detail}"
        if exc.status_code == 404:
            message += f" (this server has: {', '.join(paths)})"
        headers = dict(exc.headers or {})
        if exc.status_code == 405:  # Starlette names one route's methods; a path may have several (GET, POST /)
            headers["Allow"] = ", ".join(sorted({m for r in app.routes if getattr(r, "path", None) == request.url.path
                                                 for m in getattr(r, "methods", ())}))
        return _error(request, exc.status_code, "not_found" if exc.status_code == 404 else "http_error", message,
                      headers)

    @app.exception_handler(RequestValidationError)
    async def _validation(request: Request, exc: RequestValidationError):
        return _error(request, 422, "validation_error", "; ".join(dict.fromkeys(_problem(e) for e in exc.errors())))

    @app.exception_handler(KilnError)
    async def _kiln_error(request: Request, exc: KilnError):
        return _error(request, 422 if isinstance(exc, UsageError) else 500, "invalid_request", exc.message)

    @app.exception_handler(Exception)
    async def _internal(request: Request, exc: Exception):
        log.error("unhandled %s on %s %s", type(exc).__name__, request.method, request.url.path, exc_info=exc)
        return _error(request, 500, "internal_error", f"{type(exc).__name__}: the server failed to handle this request")


def _problem(error: dict[str, Any]) -> str:
    """One validation error as 'field.path: message', without pydantic's union-branch tags in the path."""
    path = [str(p) for p in error["loc"] if p != "body" and not (isinstance(p, str) and ("[" in p or "-" in p))]
    message = error["msg"]
    if error.get("type") == "string_pattern_mismatch":
        message = "must hold a non-blank character"
    return f"{'.'.join(path) or 'body'}: {message}"


def _v2_names(schema: dict[str, Any], names: list[str]) -> None:
    """The v2 paths' {name} can only be a served model's name, and {version} only 1."""
    for path, item in schema.get("paths", {}).items():
        if path.startswith("/v2/models/"):
            for operation in item.values():
                for parameter in operation.get("parameters", []):
                    if parameter.get("in") == "path":
                        parameter["schema"] = {"type": "string", "enum": names if parameter["name"] == "name"
                                               else ["1"]}


def _exact_openapi(app: FastAPI, routes: list[Route]) -> dict[str, Any]:
    """FastAPI's schema, with this server's limits and model names filled in."""
    if app.openapi_schema:
        return app.openapi_schema
    schema = get_openapi(title=app.title, version="1", description=app.description, routes=app.routes)
    components = schema.setdefault("components", {}).setdefault("schemas", {})
    if WireProtocol.V2 in app.state.config.protocols:
        from kiln.serving.v2 import http as v2_http

        components.update(v2_http.schemas())
        _v2_names(schema, list(app.state.tasks))
    if WireProtocol.TEI in app.state.config.protocols and app.state.models:
        tei.exact_schema(schema, next(iter(app.state.models.values())))
    limit = app.state.config.max_inputs_per_request
    for route in routes:
        model = components.get(route.request.__name__, {})
        properties = model.get("properties", {})
        inputs = properties.get(route.inputs_field, {})
        for variant in inputs.get("anyOf", [inputs]):
            # A pair keeps its own maxItems (TEI's [a, b]); a text as token ids is one input, however long.
            if variant.get("type") == "array" and variant.get("items", {}).get("type") != "integer":
                variant["maxItems"] = min(limit, variant.get("maxItems", limit))
        doing = app.state.route_models[route.path]
        if app.state.models and doing:  # token ids: of the vocabulary of the models the route serves
            tei.cap_token_ids(inputs, max(app.state.models[n].predictor.encoder.tokenizer.get_vocab_size()
                                          for n in doing) - 1)
        if "anyOf" in properties.get("prompt_name", {}):  # the served models' prompt names; none: only null
            names = sorted({name for n in doing for name in app.state.task_configs[n].prompts})
            variants = properties["prompt_name"].get("anyOf", [])
            properties["prompt_name"]["anyOf"] = [{**v, "enum": names} if v.get("type") == "string" else v
                                                  for v in variants if v.get("type") != "string" or names]
        sizes = [app.state.task_configs[n].dimension for n in doing]
        if "dimensions" in properties and sizes and None not in sizes:  # Matryoshka: at most the served size
            for variant in properties["dimensions"].get("anyOf", []):
                if variant.get("type") == "integer":
                    variant["maximum"] = max(sizes)
        if "precision" in properties and not all(app.state.calibrated[n] for n in doing):
            # int8/uint8 need the artifact's output calibration: offered only where every model has it
            properties["precision"]["enum"] = [p for p in properties["precision"].get("enum", [])
                                               if not p.endswith("int8")]
        if "model" in properties and not (route.any_model_name and len(app.state.tasks) == 1):
            named = {"type": "string", "enum": doing}
            optional = "model" not in model.get("required", [])
            properties["model"] = {**({"anyOf": [named, {"type": "null"}]} if optional else named),
                                   "description": properties["model"].get("description", "Which served model.")}
    app.openapi_schema = schema
    return schema
