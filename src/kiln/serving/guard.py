"""Admission control for inference routes, as plain ASGI: API key, body size, in-flight limit, request counts,
and cancellation of a request whose client went away (so the batcher drops it before it costs compute).

Plain ASGI rather than Starlette's BaseHTTPMiddleware: that one wraps every request in a task group and memory
streams, which costs the event loop time the batcher needs.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

import orjson

from kiln.serving.admission import Admission
from kiln.serving.metrics import Metrics

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


def error_body(kind: str, message: str) -> bytes:
    return orjson.dumps({"error": {"type": kind, "message": message}})


class Guard:
    """``route_of(path)``: the route label an inference path is counted under (a v2 path's template), or None for
    paths the guard lets through untouched; ``error(path, kind, message)``: a refusal's body in the shape of the
    protocol that owns the path."""

    def __init__(self, app: ASGIApp, *, route_of: Callable[[str], str | None], metrics: Metrics,
                 api_key: str | None, max_body_bytes: int, admission: Admission,
                 error: Callable[[str, str, str], bytes] = lambda path, kind, message: error_body(kind, message)
                 ) -> None:
        self.app, self.route_of, self.metrics, self.error = app, route_of, metrics, error
        self.api_key, self.max_body_bytes, self.admission = api_key, max_body_bytes, admission

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        route = self.route_of(scope["path"]) if scope["type"] == "http" and scope["method"] == "POST" else None
        if route is None:
            await self.app(scope, receive, send)
            return
        path, url_path = route, scope["path"]
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        if self.api_key is not None and not _authorized(headers, self.api_key):
            await self._refuse(send, url_path, path, 401, "unauthorized",
                               "missing or wrong API key (Authorization: Bearer KEY)")
            return
        length = headers.get("content-length", "")
        if length.isdigit() and int(length) > self.max_body_bytes:
            await self._refuse(send, url_path, path, 413, "payload_too_large", f"request body of {length} bytes is "
                               f"over the {self.max_body_bytes}-byte limit", reason="payload_too_large")
            return
        if not self.admission.enter():  # the budgets HTTP shares with gRPC (kiln.serving.admission)
            kind = "overloaded" if self.admission.status == 429 else "memory"
            await self._refuse(send, url_path, path, self.admission.status, kind, self.admission.refusal,
                               reason=kind, extra=[(b"retry-after", b"1")])
            return
        try:
            await self._admitted(scope, receive, send, path, url_path)
        finally:
            self.admission.leave()

    async def _admitted(self, scope: Scope, receive: Receive, send: Send, path: str, url_path: str) -> None:
        body = await read_at_most(receive, self.max_body_bytes)  # also bounds chunked bodies with no length
        if body is None:
            await self._refuse(send, url_path, path, 413, "payload_too_large", f"request body is over the "
                               f"{self.max_body_bytes}-byte limit", reason="payload_too_large")
            return
        status = {"code": 499}  # nginx's "client closed request": what is counted when no answer was sent

        async def counting_send(message: Message) -> None:
            if message["type"] == "http.response.start":
                status["code"] = message["status"]
            await send(message)

        work = asyncio.ensure_future(self.app(scope, replay(body), counting_send))
        gone = asyncio.ensure_future(receive())  # with the body read, the next message is http.disconnect
        try:
            await asyncio.wait({work, gone}, return_when=asyncio.FIRST_COMPLETED)
            if work.done():
                work.result()  # an app error propagates to Starlette's 500 handler
            else:  # the client went away: cancelling drops its inputs from the batcher's queue
                work.cancel()
                self.metrics.rejections.labels("client_gone").inc()
                with contextlib.suppress(asyncio.CancelledError):
                    await work
        except Exception:
            status["code"] = 500
            raise
        finally:
            work.cancel()  # no-op when finished; stops it if this handler itself was cancelled
            gone.cancel()
            self.metrics.requests.labels(path, str(status["code"])).inc()

    async def _refuse(self, send: Send, url_path: str, route: str, status: int, kind: str, message: str, *,
                      reason: str | None = None, extra: list[tuple[bytes, bytes]] | None = None) -> None:
        if reason is not None:
            self.metrics.rejections.labels(reason).inc()
        self.metrics.requests.labels(route, str(status)).inc()
        body = self.error(url_path, kind, message)
        await send({"type": "http.response.start", "status": status,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                                *(extra or [])]})
        await send({"type": "http.response.body", "body": body})


def _authorized(headers: dict[str, str], key: str) -> bool:
    header = headers.get("authorization", "")
    given = header.removeprefix("Bearer ").strip() if header.startswith("Bearer ") else headers.get("x-api-key", "")
    return hmac.compare_digest(given.encode(), key.encode())


async def read_at_most(receive: Receive, limit: int | None) -> bytes | None:
    """The whole request body; None once it passes ``limit`` bytes (None: no limit)."""
    chunks, size = [], 0
    while True:
        message = await receive()
        if message["type"] != "http.request":
            break
        chunks.append(message.get("body", b""))
        size += len(chunks[-1])
        if limit is not None and size > limit:
            return None
        if not message.get("more_body", False):
            break
    return b"".join(chunks)


def replay(body: bytes) -> Receive:
    """The body once; afterwards nothing (the guard itself watches for the disconnect)."""
    messages = [{"type": "http.request", "body": body, "more_body": False}]

    async def receive_once() -> Message:
        if messages:
            return messages.pop()
        await asyncio.Event().wait()  # never set: the guard cancels the app when the client goes
        raise AssertionError("unreachable")

    return receive_once
