"""Run the app under uvicorn; a signal-triggered graceful drain is a clean exit (status 0)."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import socket
import threading
from collections.abc import Iterator

import uvicorn
from fastapi import FastAPI

from kiln.log import configure
from kiln.serving.heap import settle_heap

DRAIN_SIGNALS = (signal.SIGINT, signal.SIGTERM)
# Connections accepted just before the signal may not have delivered their request yet; uvicorn closes such
# "idle" connections at once, which their clients see as a reset after connecting (a lost request). Listening
# stops first, then this long for those requests to arrive, then uvicorn's own drain.
ACCEPT_GRACE_S = 0.25


class _DrainingServer(uvicorn.Server):
    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        # uvicorn re-raises the captured signal after shutdown, so the process dies by SIGTERM (-15) even when
        # every accepted request was answered. Orchestrators read that as a crash; kiln exits 0 after a clean drain.
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        originals = {sig: signal.signal(sig, self.handle_exit) for sig in DRAIN_SIGNALS}
        try:
            yield
        finally:
            for sig, handler in originals.items():
                signal.signal(sig, handler)

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets)  # the app's lifespan has loaded and warmed every model by now
        if self.started:
            settle_heap()  # the process is the server's alone (tests serving in-process keep their own collector)

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        for server in self.servers:
            server.close()
        for sock in sockets or []:
            sock.close()
        await asyncio.sleep(ACCEPT_GRACE_S)
        await super().shutdown(sockets)


def run_server(app: FastAPI, host: str, port: int, *, access_log: bool = False, drain_seconds: float = 30.0,
               log_format: str = "text") -> bool:
    """Serve until SIGTERM/SIGINT, finish accepted requests (up to `drain_seconds`), return whether it started.

    kiln's and uvicorn's loggers share one handler in ``log_format`` (text or JSON lines). The access log is off
    by default: a log line per request costs the event loop time the batcher needs, and /metrics already counts
    requests by route and status; every 5xx is logged with its request id either way.
    """
    configure(log_format)
    server = _DrainingServer(uvicorn.Config(app, host=host, port=port, log_level="info", access_log=access_log,
                                            timeout_graceful_shutdown=drain_seconds, log_config=None))
    server.run()
    return server.started
