"""The Open Inference Protocol over gRPC: ``inference.GRPCInferenceService`` on ``kiln serve --grpc-port``.

The messages are KServe's published proto as Triton extends it (field for field the same for these RPCs); the
generated Python ships with ``tritonclient[grpc]`` (``kiln[grpc]``), so kiln compiles nothing. The service runs on
the server's own event loop (grpc.aio) and answers through the same batcher, limits and metrics as HTTP:
ServerLive, ServerReady, ModelReady, ServerMetadata, ModelMetadata and ModelInfer (inputs as ``contents`` or
``raw_input_contents``, outputs as ``raw_output_contents``, what tritonclient reads). Errors carry the gRPC status
matching the HTTP one; the API key comes in the ``authorization: Bearer KEY`` metadata.
"""

from __future__ import annotations

import hmac
from typing import Any

from kiln.log import get_logger, request_id
from kiln.serving.endpoints import HTTPError, not_ready
from kiln.serving.v2.core import InferCall, datatype, metadata, run_infer, served_model, server_metadata
from kiln.serving.v2.http import deserialize_bytes, tensor_bytes

log = get_logger("serve.grpc")
ROUTE = "grpc:ModelInfer"  # the label its requests are counted under in kiln_requests


def _modules() -> tuple[Any, Any, Any]:
    try:
        import grpc
        from tritonclient.grpc import service_pb2, service_pb2_grpc
    except ImportError as err:
        from kiln.errors import UsageError

        raise UsageError("grpc_port needs grpcio and the v2 protocol's messages: pip install 'kiln[grpc]'") from err
    return grpc, service_pb2, service_pb2_grpc


def _status(grpc: Any, http_status: int) -> Any:
    """The gRPC status code for an HTTP status (as Triton maps them)."""
    codes = {400: grpc.StatusCode.INVALID_ARGUMENT, 401: grpc.StatusCode.UNAUTHENTICATED,
             404: grpc.StatusCode.NOT_FOUND, 413: grpc.StatusCode.INVALID_ARGUMENT,
             422: grpc.StatusCode.INVALID_ARGUMENT, 429: grpc.StatusCode.RESOURCE_EXHAUSTED,
             503: grpc.StatusCode.UNAVAILABLE}
    return codes.get(http_status, grpc.StatusCode.INTERNAL)


def _strings(tensor: Any, raw: bytes | None, where: str) -> list[str]:
    if tensor.datatype != "BYTES":
        raise HTTPError(400, "invalid_request", f"{where}: texts are BYTES tensors (got {tensor.datatype})")
    shape = list(tensor.shape)
    if not 1 <= len(shape) <= 2 or (len(shape) == 2 and shape[1] != 1):
        raise HTTPError(400, "invalid_request", f"{where}: shape must be [n, 1] or [n], got {shape}")
    values = deserialize_bytes(raw, where) if raw is not None else [
        v.decode("utf-8", errors="strict") for v in tensor.contents.bytes_contents]
    if len(values) != shape[0]:
        raise HTTPError(400, "invalid_request", f"{where}: shape {shape} holds {shape[0]} elements; data has "
                        f"{len(values)}")
    return values


def servicer(app: Any) -> Any:
    """The GRPCInferenceService implementation over ``app``'s served models."""
    grpc, pb, pb_grpc = _modules()
    state = app.state

    class Service(pb_grpc.GRPCInferenceServiceServicer):
        draining = False  # set at shutdown: new inference RPCs are refused (UNAVAILABLE) before the server stops

        async def _fail(self, context: Any, error: HTTPError) -> None:
            await context.abort(_status(grpc, error.status), error.message)

        async def ServerLive(self, request, context):  # noqa: N802 (the proto's names)
            return pb.ServerLiveResponse(live=True)

        async def ServerReady(self, request, context):  # noqa: N802
            return pb.ServerReadyResponse(ready=not_ready(state.models, probe=True) is None)

        async def ModelReady(self, request, context):  # noqa: N802
            try:
                served = served_model(state.models, request.name, request.version, ready=False)
            except HTTPError as err:
                await self._fail(context, err)
            return pb.ModelReadyResponse(ready=served.ready)

        async def ServerMetadata(self, request, context):  # noqa: N802
            found = server_metadata(())
            return pb.ServerMetadataResponse(name=found["name"], version=found["version"], extensions=[])

        async def ModelMetadata(self, request, context):  # noqa: N802
            try:
                found = metadata(served_model(state.models, request.name, request.version, ready=False))
            except HTTPError as err:
                await self._fail(context, err)
            tensor = pb.ModelMetadataResponse.TensorMetadata
            return pb.ModelMetadataResponse(
                name=found["name"], versions=found["versions"], platform=found["platform"],
                inputs=[tensor(name=t["name"], datatype=t["datatype"], shape=t["shape"]) for t in found["inputs"]],
                outputs=[tensor(name=t["name"], datatype=t["datatype"], shape=t["shape"]) for t in found["outputs"]])

        async def ModelInfer(self, request, context):  # noqa: N802
            config, metrics, admission = state.config, state.metrics, state.admission
            code = "200"
            admitted = False
            try:
                if self.draining:
                    raise HTTPError(503, "not_ready", "the server is shutting down")
                admitted = admission.enter()  # the budget gRPC shares with HTTP (kiln.serving.admission)
                if not admitted:
                    raise HTTPError(admission.status, "overloaded" if admission.status == 429 else "memory",
                                    admission.refusal)
                if config.api_key is not None:
                    given = dict(context.invocation_metadata() or ()).get("authorization", "")
                    if not hmac.compare_digest(given.removeprefix("Bearer ").strip().encode(), config.api_key.encode()):
                        raise HTTPError(401, "unauthorized", "missing or wrong API key (authorization: Bearer KEY)")
                raw = list(request.raw_input_contents)
                if raw and len(raw) != len(request.inputs):
                    raise HTTPError(400, "invalid_request", f"{len(raw)} raw_input_contents for {len(request.inputs)} "
                                    "inputs")
                columns = {t.name: _strings(t, raw[i] if raw else None, f"input {t.name}")
                           for i, t in enumerate(request.inputs)}
                call = InferCall(request.model_name, request.model_version, columns,
                                 tuple(o.name for o in request.outputs), request.id)
                with state.tracing.request("/v2/models/{name}/infer", request_id=request.id or request_id.get(),
                                           transport="grpc") as trace:
                    arrays = await run_infer(state, call, trace)
            except HTTPError as err:
                code = str(err.status)
                await self._fail(context, err)
            except UnicodeDecodeError as err:
                code = "400"
                await self._fail(context, HTTPError(400, "invalid_request", f"a BYTES element is not UTF-8 ({err})"))
            finally:
                if admitted:
                    admission.leave()
                metrics.requests.labels(ROUTE, code).inc()
            response = pb.ModelInferResponse(model_name=call.model, model_version="1", id=request.id)
            for name, array in arrays.items():
                response.outputs.add(name=name, datatype=datatype(array), shape=list(array.shape))
                response.raw_output_contents.append(tensor_bytes(array))
            return response

    return Service()


async def start(app: Any, port: int, host: str = "0.0.0.0") -> Any:  # noqa: S104 (as uvicorn's --host default)
    """Serve the gRPC service on ``port``; returns the running grpc.aio server (stop it with ``stop``)."""
    grpc, _, pb_grpc = _modules()
    config = app.state.config
    server = grpc.aio.server(maximum_concurrent_rpcs=config.max_concurrent, options=[
        ("grpc.max_receive_message_length", config.max_body_bytes),
        ("grpc.max_send_message_length", 64 * 1024 * 1024)])
    service = servicer(app)
    pb_grpc.add_GRPCInferenceServiceServicer_to_server(service, server)
    server.kiln_service = service  # stop() refuses new RPCs through it before stopping
    if server.add_insecure_port(f"{host}:{port}") == 0:
        from kiln.errors import UsageError

        raise UsageError(f"grpc_port {port}: cannot listen there (in use?)")
    await server.start()
    log.info("v2 gRPC (inference.GRPCInferenceService) listening on %s:%d", host, port)
    return server


async def stop(server: Any, grace_s: float = 30.0, settle_s: float = 0.25) -> None:
    """Drain: refuse new inference RPCs with UNAVAILABLE, give RPCs already on the wire ``settle_s`` to reach a
    handler (grpc's own stop cancels those that have not, which a client sees as CANCELLED, not as a refusal it
    may retry), then stop, letting those in flight finish within ``grace_s``."""
    import asyncio

    server.kiln_service.draining = True
    await asyncio.sleep(settle_s)
    await server.stop(grace_s)
