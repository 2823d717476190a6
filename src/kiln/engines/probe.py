"""Loading an engine in a child process before loading it here, so a native crash ends the child, not kiln.

A runtime that crashes in native code takes the whole process with it: no exception, no outcome, no artifact. With
OpenVINO 2026.4.1 on an AMX Xeon, compiling a rotary encoder's IR (NomicBERT, GTE; not BERT or Jina v3) with the
bf16 hint on one thread dies of SIGFPE in the CPU plugin, at every model size tried (hidden 32 to 256), and two
threads compile it fine: kiln optimize, whose batch-drift check loads one-thread sessions, ended there with "Floating
point exception" and nothing written. :class:`EngineProbe` loads each (model, options) once in a long-lived child
first; a child that dies says how (signal and name), and the caller reports that variant as failed and goes on.
"""

from __future__ import annotations

import multiprocessing
from collections.abc import Callable
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from kiln.engines.base import EngineOptions
from kiln.system.children import ChildDied, describe_exit, receive

# A compile of a large IR takes seconds; a child that says nothing for this long is stuck, not slow.
PROBE_TIMEOUT_S = 600.0


def _serve(conn: Connection) -> None:
    """The child: load each (engine, path, options) it is sent, drop it, and say so. An exception is not this
    probe's business: the caller's own load raises it again, with its usual message."""
    from kiln.engines import create_engine

    while True:
        try:
            request = conn.recv()
        except EOFError:
            return
        engine, path, options = request
        try:
            create_engine(engine, Path(path), options)
        except Exception:  # noqa: BLE001, S110 - the caller's own load raises it (see the docstring)
            pass
        conn.send(None)


class EngineProbe:
    """One child that loads engines ahead of the caller; replaced when one of them kills it."""

    def __init__(self, serve: Callable[[Connection], None] = _serve) -> None:
        """``serve``: the child's loop (a test hands it one that crashes the way a runtime does)."""
        self._serve = serve
        self._process: Any = None
        self._conn: Connection | None = None
        self._seen: dict[tuple[str, str, EngineOptions], str | None] = {}

    def _start(self) -> None:
        # spawn: the parent holds runtime thread pools a forked child would inherit half-made
        ctx = multiprocessing.get_context("spawn")
        parent, child = ctx.Pipe()
        self._process = ctx.Process(target=self._serve, args=(child,), daemon=True, name="kiln-engine-probe")
        self._process.start()
        child.close()
        self._conn = parent

    def crash(self, engine: str, path: Path, options: EngineOptions) -> str | None:
        """How loading ``engine`` over ``path`` with ``options`` killed the child (signal and name), or None when
        it loaded (or raised an exception, which the caller's own load raises again)."""
        key = (engine, str(path), options)
        if key not in self._seen:
            self._seen[key] = self._ask(engine, path, options)
        return self._seen[key]

    def _ask(self, engine: str, path: Path, options: EngineOptions) -> str | None:
        if self._process is None or not self._process.is_alive():
            self._start()
        assert self._conn is not None
        self._conn.send((engine, str(path), options))
        try:
            receive(self._conn, self._process, PROBE_TIMEOUT_S)
        except ChildDied:
            code = self._process.exitcode
            self.close()
            return f"{engine} crashed loading it: the child process that tried first {describe_exit(code)}"
        except TimeoutError:
            self.close()
            return f"{engine} did not finish loading it in {PROBE_TIMEOUT_S:g} s (in a child process)"
        return None

    def close(self) -> None:
        """Stop the child (a later probe starts another)."""
        if self._conn is not None:
            self._conn.close()
            self._conn = None
        if self._process is not None:
            self._process.join(timeout=5)
            if self._process.is_alive():
                self._process.kill()
                self._process.join(timeout=5)
            self._process = None
