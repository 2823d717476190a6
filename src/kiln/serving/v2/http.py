"""The Open Inference Protocol over HTTP: health, metadata and inference routes, JSON tensors and the binary
tensor data extension (what ``tritonclient.http`` sends by default: a JSON header, then each binary tensor).

Routes (``{name}`` is the served model's name; ``/versions/1`` may be added after it):
GET /v2, /v2/health/live, /v2/health/ready, /v2/models/{name}, /v2/models/{name}/ready;
POST /v2/models/{name}/infer. Errors are ``{"error": message}`` with the HTTP status, as the protocol says.
"""

from __future__ import annotations

import struct
from typing import Annotated, Any, Literal

import numpy as np
import orjson
from fastapi import FastAPI, Request
from fastapi.responses import Response
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from kiln.log import request_id
from kiln.serving.endpoints import HTTPError, JSONBody, not_ready
from kiln.serving.v2.core import VERSION, InferCall, datatype, metadata, run_infer, served_model, server_metadata

HEADER_LENGTH = "inference-header-content-length"
EXTENSIONS = ("binary_tensor_data",)
INFER_PATHS = ("/v2/models/{name}/infer", "/v2/models/{name}/versions/{version}/infer")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class InputTensor(_Strict):
    name: str
    shape: Annotated[list[Annotated[int, Field(ge=0, le=1_000_000)]], Field(min_length=1, max_length=2)]
    datatype: Literal["BYTES"] = Field(description="Texts are BYTES tensors of shape [n, 1] (or [n]).")
    parameters: dict[str, Any] | None = Field(None, description="binary_data_size: the tensor is in the binary part.")
    data: list[Any] | None = Field(None, description="The strings, flat or nested; absent with binary_data_size.")


class OutputRequest(_Strict):
    name: str
    parameters: dict[str, Any] | None = Field(None, description="binary_data: answer this output in binary.")


class InferRequest(_Strict):
    id: str | None = None
    # Not in the protocol's request, but KServe's own REST client sends them: accepted when they name the path's model.
    model_name: str | None = None
    model_version: str | None = None
    parameters: dict[str, Any] | None = Field(None, description="binary_data_output: every output in binary.")
    inputs: Annotated[list[InputTensor], Field(min_length=1)]
    outputs: list[OutputRequest] | None = None


class OutputTensor(BaseModel):
    name: str
    datatype: str
    shape: list[int]
    parameters: dict[str, Any] | None = None
    data: list[Any] | None = None


class InferResponse(BaseModel):
    model_name: str
    model_version: str
    id: str | None = None
    outputs: list[OutputTensor]


class V2Error(BaseModel):
    error: str


def serialize_bytes(values: np.ndarray) -> bytes:
    """BYTES elements as the protocol's binary form: each a 4-byte little-endian length, then its bytes."""
    out = bytearray()
    for value in values.reshape(-1):
        raw = value if isinstance(value, bytes) else str(value).encode()
        out += struct.pack("<I", len(raw)) + raw
    return bytes(out)


def tensor_bytes(array: np.ndarray) -> bytes:
    """An output tensor's binary form: BYTES as :func:`serialize_bytes`, numbers little-endian, row-major."""
    if datatype(array) == "BYTES":
        return serialize_bytes(array)
    return np.ascontiguousarray(array).astype(array.dtype.newbyteorder("<")).tobytes()


def deserialize_bytes(raw: bytes, where: str) -> list[str]:
    values, at = [], 0
    while at < len(raw):
        if at + 4 > len(raw):
            raise HTTPError(400, "invalid_request", f"{where}: binary BYTES data ends inside a length prefix")
        (size,) = struct.unpack_from("<I", raw, at)
        at += 4
        if at + size > len(raw):
            raise HTTPError(400, "invalid_request", f"{where}: binary BYTES element of {size} bytes runs past the data")
        values.append(_text(raw[at : at + size], where))
        at += size
    return values


def _text(raw: bytes, where: str) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as err:
        raise HTTPError(400, "invalid_request", f"{where}: a BYTES element is not UTF-8 text ({err})") from err


def _flat(data: Any) -> list[Any]:
    return [x for item in data for x in _flat(item)] if isinstance(data, list) else [data]


def parse_request(name: str, version: str | None, body: bytes, header_length: str | None) -> InferCall:
    """The HTTP body (JSON, or a JSON header of ``header_length`` bytes followed by binary tensors) as a call."""
    if header_length is not None:
        if not header_length.isdigit() or int(header_length) > len(body):
            raise HTTPError(400, "invalid_request", f"Inference-Header-Content-Length {header_length!r} is not a "
                            f"length within the {len(body)}-byte body")
        header, binary = body[: int(header_length)], body[int(header_length) :]
    else:
        header, binary = body, b""
    try:
        request = InferRequest.model_validate_json(header)
    except ValidationError as err:
        problems = "; ".join(f"{'.'.join(str(p) for p in e['loc']) or 'body'}: {e['msg']}" for e in err.errors())
        raise HTTPError(400, "invalid_request", f"not a v2 inference request: {problems}") from err
    if request.model_name not in (None, name) or request.model_version not in (None, "", version or VERSION):
        raise HTTPError(400, "invalid_request", f"the body names model {request.model_name!r} version "
                        f"{request.model_version!r}; the path names {name!r} version {version or VERSION!r}")
    columns, at = {}, 0
    for tensor in request.inputs:
        where = f"input {tensor.name}"
        if len(tensor.shape) == 2 and tensor.shape[1] != 1:
            raise HTTPError(400, "invalid_request", f"{where}: shape must be [n, 1] or [n] (one text per row), got "
                            f"{tensor.shape}")
        size = (tensor.parameters or {}).get("binary_data_size")
        if size is not None:
            if not isinstance(size, int) or size < 0 or at + size > len(binary):
                raise HTTPError(400, "invalid_request", f"{where}: binary_data_size {size!r} runs past the "
                                f"{len(binary)} bytes of binary data")
            values = deserialize_bytes(binary[at : at + size], where)
            at += size
        elif tensor.data is not None:
            values = _flat(tensor.data)
            if not all(isinstance(v, str) for v in values):
                raise HTTPError(400, "invalid_request", f"{where}: BYTES data must be strings")
        else:
            raise HTTPError(400, "invalid_request", f"{where}: no data (give data, or binary_data_size with the "
                            "binary tensor data extension)")
        if len(values) != tensor.shape[0]:
            raise HTTPError(400, "invalid_request", f"{where}: shape {tensor.shape} holds {tensor.shape[0]} elements; "
                            f"data has {len(values)}")
        if tensor.name in columns:
            raise HTTPError(400, "invalid_request", f"{where} is given twice")
        columns[tensor.name] = values
    outputs = tuple(o.name for o in request.outputs or ())
    binary_all = bool((request.parameters or {}).get("binary_data_output", False))
    binary_outputs = {o.name: bool((o.parameters or {}).get("binary_data", binary_all)) for o in request.outputs or ()}
    return InferCall(name, version, columns, outputs, request.id or "",
                     {"binary_all": binary_all, "binary": binary_outputs})


def render_response(call: InferCall, arrays: dict[str, np.ndarray]) -> Response:
    """JSON tensors, or (where asked) a JSON header and the binary tensors after it."""
    outputs, blobs = [], []
    for name, array in arrays.items():
        kind = datatype(array)
        entry: dict[str, Any] = {"name": name, "datatype": kind, "shape": list(array.shape)}
        if call.parameters["binary"].get(name, call.parameters["binary_all"]):
            blob = tensor_bytes(array)
            entry["parameters"] = {"binary_data_size": len(blob)}
            blobs.append(blob)
        else:
            entry["data"] = [v.decode() if isinstance(v, bytes) else v for v in array.reshape(-1).tolist()]
        outputs.append(entry)
    body = {"model_name": call.model, "model_version": VERSION, **({"id": call.id} if call.id else {}),
            "outputs": outputs}
    header = orjson.dumps(body)
    if not blobs:
        return Response(header, media_type="application/json")
    return Response(header + b"".join(blobs), media_type="application/octet-stream",
                    headers={HEADER_LENGTH: str(len(header))})


def mount(app: FastAPI) -> None:
    """The v2 routes, documented with the protocol's JSON shapes (the binary extension is read from the same body)."""
    errors = {status: {"model": V2Error, "description": text} for status, text in (
        (400, "Not a v2 request for this model: the message names the input, shape or field."),
        (401, "Missing or wrong API key (with --api-key)."),
        (404, "No such model or version."),
        (413, "Body over the size limit, or more rows than --max-inputs-per-request."),
        (429, "Too many requests in flight; retry after the Retry-After seconds."),
        (500, "Inference failed."),
        (503, "The model is still loading, shutting down, or its batching loop died."))}
    state = app.state

    @app.get("/v2", tags=["v2"], summary="Server metadata")
    async def v2_server() -> dict[str, Any]:
        return server_metadata(EXTENSIONS)

    @app.get("/v2/health/live", tags=["v2"], summary="Liveness", responses={200: {"model": dict}})
    async def v2_live() -> dict[str, bool]:
        return {"live": True}

    @app.get("/v2/health/ready", tags=["v2"], summary="Readiness of every model", responses={400: errors[400]})
    async def v2_ready() -> Any:
        error = not_ready(state.models, probe=True)
        if error is not None:  # the protocol answers "not ready" with a 4xx
            return JSONBody({"error": error.message}, status_code=400)
        return {"ready": True}

    for prefix in ("/v2/models/{name}", "/v2/models/{name}/versions/{version}"):
        @app.get(prefix, tags=["v2"], summary="Model metadata: its input and output tensors",
                 responses={404: errors[404], 400: errors[400]})
        async def v2_model(name: str, version: str | None = None) -> dict[str, Any]:
            return metadata(served_model(state.models, name, version, ready=False))

        @app.get(f"{prefix}/ready", tags=["v2"], summary="Model readiness",
                 responses={404: errors[404], 400: errors[400]})
        async def v2_model_ready(name: str, version: str | None = None) -> Any:
            served = served_model(state.models, name, version, ready=False)
            if not served.ready:
                return JSONBody({"error": served.unready_reason}, status_code=400)
            return {"name": name, "ready": True}

        @app.post(f"{prefix}/infer", tags=["v2"], summary="Inference (JSON tensors or the binary extension)",
                  response_model=InferResponse, responses=errors,
                  openapi_extra={"requestBody": {"required": True, "content": {"application/json": {
                      "schema": {"$ref": "#/components/schemas/InferRequest"}}}}})
        async def v2_infer(name: str, request: Request, version: str | None = None) -> Response:
            call = parse_request(name, version, await request.body(), request.headers.get(HEADER_LENGTH))
            with state.tracing.request("/v2/models/{name}/infer", request_id=request_id.get()) as trace:
                return render_response(call, await run_infer(state, call, trace))


def schemas() -> dict[str, Any]:
    """The request's JSON schema components, for the OpenAPI document (the route reads its body itself)."""
    schema = InferRequest.model_json_schema(ref_template="#/components/schemas/{model}")
    return {**schema.pop("$defs", {}), "InferRequest": schema}
