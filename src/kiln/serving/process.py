"""A server in a child process: start it on a free loopback port, wait until it listens, read its exit counts.

The load benchmark and the real-process tests drive servers this way; the exit line parsed here is the one
kiln.serving.app logs after its drain, so its format lives in one place.
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from typing import Any

from kiln.serving.metrics import STOPPED
from kiln.system.children import describe_exit

LISTENING = "Uvicorn running on"  # logged once the socket listens; "startup complete" comes before that


class ServerStartError(RuntimeError):
    pass


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def serve_in_thread(app: Any, timeout_s: float = 60) -> Iterator[str]:
    """Run ``app`` under uvicorn in a daemon thread on a free loopback port; yields its base URL once it listens
    (ServerStartError after ``timeout_s``), and stops it on exit. For tests and benchmarks that need a real socket
    and the app's state in the same process."""
    import uvicorn

    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + timeout_s
        while not server.started:
            if not thread.is_alive() or time.monotonic() > deadline:
                raise ServerStartError(f"the in-thread server did not start within {timeout_s:g} s")
            time.sleep(0.01)
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=timeout_s)


def start_server(command: list[str], timeout_s: float = 120) -> tuple[subprocess.Popen, int]:
    """Run ``command --port P`` and return (process, P) once it listens; ``process.log`` keeps collecting stderr.

    The child is watched, not only read: a thread reads its stderr into a queue while this waits on that queue
    with the deadline, so a child that hangs without printing fails after ``timeout_s`` and one that dies fails
    at once, with its exit status and last lines (ServerStartError either way).
    """
    port = free_port()
    proc = subprocess.Popen([*command, "--port", str(port)], stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"})
    proc.log = []
    lines: queue.Queue[str | None] = queue.Queue()

    def read() -> None:
        for line in proc.stderr:
            proc.log.append(line)
            lines.put(line)
        lines.put(None)  # EOF: the child closed stderr (it is exiting)

    threading.Thread(target=read, daemon=True).start()
    deadline = time.monotonic() + timeout_s
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            proc.kill()
            proc.wait(timeout=10)
            raise ServerStartError(f"server did not start listening within {timeout_s:g} s: {' '.join(command)}\n"
                                   f"{''.join(proc.log[-20:]) or '(it printed nothing)'}")
        try:
            line = lines.get(timeout=min(remaining, 0.5))
        except queue.Empty:
            line = ""
        if line and LISTENING in line:
            return proc, port
        if line is None or proc.poll() is not None:
            code = proc.wait(timeout=10)
            raise ServerStartError(f"server {describe_exit(code)} before listening: {' '.join(command)}\n"
                                   f"{''.join(proc.log[-20:])}")


def exit_counts(proc: subprocess.Popen, wait_s: float = 10) -> dict[str, int] | None:
    """Inference requests by HTTP status, as the exited server logged them (None if it logged no such line)."""
    deadline = time.monotonic() + wait_s
    while True:  # the log thread may still be reading the last lines
        line = next((x for x in proc.log if STOPPED in x), None)
        if line is not None:
            return json.loads(line[line.index("{"):])
        if time.monotonic() > deadline:
            return None
        time.sleep(0.05)
