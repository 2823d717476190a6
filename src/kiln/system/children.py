"""Child processes watched by their sentinel: a worker that dies (OOM killer, native crash) is noticed at once,
with how it died, instead of after a silence on a pipe it will never write to again."""

from __future__ import annotations

import signal
from multiprocessing.connection import Connection, wait
from multiprocessing.process import BaseProcess
from typing import Any

# A SIGKILL nobody asked for is, on Linux, almost always the kernel's OOM killer.
_HINTS = {signal.SIGKILL: " (out of memory?)", signal.SIGSEGV: " (a crash in native code)",
          signal.SIGABRT: " (a native library aborted)", signal.SIGFPE: " (an arithmetic fault in native code)"}


def describe_exit(code: int | None) -> str:
    """How a process ended, from its exit code (``Popen.returncode`` / ``Process.exitcode``)."""
    if code is None:
        return "is still running"
    if code < 0:
        try:
            sig = signal.Signals(-code)
        except ValueError:
            return f"was killed by signal {-code}"
        return f"was killed by signal {-code} ({sig.name}){_HINTS.get(sig, '')}"
    return f"exited with status {code}"


class ChildDied(RuntimeError):
    """The child process ended before sending what the parent waited for."""


def receive(conn: Connection, process: BaseProcess, timeout: float) -> Any:
    """The next message from ``process`` on ``conn``; ChildDied as soon as the process has ended without one,
    TimeoutError after ``timeout`` seconds of silence from a live process.

    The parent must have closed its copy of the child's end of the pipe, or EOF never comes; the sentinel is
    what makes the death visible either way.
    """
    ready = wait([conn, process.sentinel], timeout=timeout)
    if not ready:
        raise TimeoutError(f"no message for {timeout:g} s")
    if conn.poll():  # read what it sent before it ended, if anything
        try:
            return conn.recv()
        except EOFError:
            pass
    process.join(timeout=5)
    raise ChildDied(f"the worker process {describe_exit(process.exitcode)}")
