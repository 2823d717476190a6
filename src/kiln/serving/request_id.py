"""Request ids and the 5xx log, as plain ASGI around the whole app.

Each request gets an id: the client's ``x-request-id`` when it is a sane token (what load balancers and
TEI/vLLM clients send), else a fresh one. It is echoed on the response, set in :data:`kiln.log.request_id` for
every log line the request causes (tasks it spawns copy the context), and every answer of status 500 or more is
logged once here, with the id, the route, the time taken and the error message the client received.
"""

from __future__ import annotations

import itertools
import logging
import re
import time
import uuid

import orjson

from kiln.log import get_logger, request_id
from kiln.serving.guard import ASGIApp, Message, Receive, Scope, Send

HEADER = b"x-request-id"
_SANE = re.compile(r"^[A-Za-z0-9._:/+=-]{1,128}$")  # no spaces or control characters: it goes into logs verbatim
log = get_logger("serve.http")


_PREFIX = uuid.uuid4().hex[:16]  # this process's own; a counter makes the rest (uuid4 per request cost ~7 us)
_COUNT = itertools.count()


def new_id() -> str:
    """32 hex digits, unique within the process and (by the random prefix) across processes."""
    return f"{_PREFIX}{next(_COUNT):016x}"


class RequestId:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        given = next((v.decode("latin-1") for k, v in scope["headers"] if k.lower() == HEADER), "")
        rid = given if _SANE.match(given) else new_id()
        token = request_id.set(rid)
        start = time.perf_counter()
        status = {"code": 0, "body": b""}

        async def stamped(message: Message) -> None:
            if message["type"] == "http.response.start":
                status["code"] = message["status"]
                message = {**message, "headers": [*[(k, v) for k, v in message.get("headers", [])
                                                     if k.lower() != HEADER], (HEADER, rid.encode())]}
            elif message["type"] == "http.response.body" and status["code"] >= 500 and len(status["body"]) < 4096:
                status["body"] += message.get("body", b"")
            await send(message)

        try:
            await self.app(scope, receive, stamped)
        finally:
            if status["code"] >= 500:  # 503 (loading, draining, dead loop) is expected on probes: a warning
                level = logging.WARNING if status["code"] == 503 else logging.ERROR
                log.log(level, "%s %s -> %d in %.1f ms: %s", scope["method"], scope["path"], status["code"],
                        1000 * (time.perf_counter() - start), _message(status["body"]),
                        extra={"status": status["code"], "path": scope["path"], "request_id": rid})
            request_id.reset(token)


def _message(body: bytes) -> str:
    """The error message of a kiln error body (the raw body, shortened, for anything else)."""
    try:
        return str(orjson.loads(body)["error"]["message"])
    except (orjson.JSONDecodeError, KeyError, TypeError):
        return body[:200].decode("utf-8", "replace") or "(no body)"
