"""Run the app under uvicorn; a signal-triggered graceful drain is a clean exit (status 0)."""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator

import uvicorn
from fastapi import FastAPI

DRAIN_SIGNALS = (signal.SIGINT, signal.SIGTERM)


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


def run_server(app: FastAPI, host: str, port: int, drain_seconds: float = 30.0) -> bool:
    """Serve until SIGTERM/SIGINT, finish accepted requests (up to `drain_seconds`), return whether it started."""
    server = _DrainingServer(uvicorn.Config(app, host=host, port=port, log_level="info",
                                            timeout_graceful_shutdown=drain_seconds))
    server.run()
    return server.started
