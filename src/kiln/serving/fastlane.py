"""The inference routes' fast lane: a valid JSON body goes straight to its endpoint, without FastAPI's routing.

FastAPI runs every request through its router, dependency solver, exit stack and exception middlewares before
the endpoint sees the body. For kiln's inference routes that was ~120 us of event-loop CPU a request, and on two
cores the event loop's CPU is taken from the engine: MiniLM int8 under 64 clients, the loop's CPU per request fell
557 -> 420 us and throughput rose ~3% with this lane (benchmarks/experiments/serve_ab/run.py at 91ffdaf, 5
alternations).

The lane changes nothing a client can see. It takes only a POST to a route of kind "infer" whose content type is
JSON, whose body parses and which the route's own request model (the one FastAPI validates with and documents)
accepts; every other request — bad JSON, a body the model rejects, another content type — goes through FastAPI
unchanged, so each error keeps FastAPI's exact status and message. An error raised by the endpoint is answered
by the app's own exception handlers, as FastAPI would.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import orjson
from fastapi import FastAPI
from pydantic import BaseModel, ValidationError
from starlette.requests import Request
from starlette.responses import Response

from kiln.serving.guard import ASGIApp, Receive, Scope, Send, read_at_most, replay


class FastLane:
    """Pure ASGI around the app's routing: ``app.state.fast_routes`` maps a path to (request model, endpoint)."""

    def __init__(self, app: ASGIApp, *, fastapi: FastAPI) -> None:
        self.app, self.fastapi = app, fastapi
        self.served = 0  # requests the lane answered (tests check that it is the path valid requests take)
        fastapi.state.fast_lane = self

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        lane = None
        if scope["type"] == "http" and scope["method"] == "POST":
            lane = self.fastapi.state.fast_routes.get(scope["path"])
        if lane is None or not _json_content(scope):
            await self.app(scope, receive, send)
            return
        body = await read_at_most(receive, None) or b""
        model, endpoint = lane
        parsed = _parsed(model, body)
        if parsed is None:  # FastAPI gives the exact error
            await self.app(scope, replay(body), send)
            return
        try:
            response = await endpoint(parsed)
        except Exception as err:
            handler = _handler(self.fastapi, err)
            if handler is None:
                raise
            response = await handler(Request(scope), err)
        self.served += 1
        await response(scope, receive, send)


def _json_content(scope: Scope) -> bool:
    """A content type FastAPI reads as JSON in every configuration: application/json, parameters allowed."""
    for name, value in scope["headers"]:
        if name.lower() == b"content-type":
            return value.split(b";", 1)[0].strip().lower() == b"application/json"
    return False


def _parsed(model: type[BaseModel], body: bytes) -> BaseModel | None:
    """The body as ``model``, validated as FastAPI validates a parsed JSON body (Python mode); None if either step
    fails."""
    try:
        return model.model_validate(orjson.loads(body))
    except (orjson.JSONDecodeError, ValidationError):
        return None


def _handler(app: FastAPI, err: Exception) -> Callable[[Request, Exception], Awaitable[Response]] | None:
    """The app's exception handler for ``err``: the nearest class in its MRO, as Starlette looks it up."""
    for cls in type(err).__mro__:
        if cls in app.exception_handlers:
            return app.exception_handlers[cls]
    return None
