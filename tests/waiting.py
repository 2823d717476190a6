"""Bounded waits for tests: a condition with a deadline, so a broken component fails the test instead of hanging it."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import pytest


def wait_until(condition: Callable[[], object], what: str, timeout: float = 30.0, poll: float = 0.01) -> None:
    """Return once ``condition()`` is true; fail the test naming ``what`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(poll)


async def until(condition: Callable[[], object], what: str, timeout: float = 10.0) -> None:
    """The event-loop version of :func:`wait_until` (yields to other tasks between checks)."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout:g} s waiting for {what}")
        await asyncio.sleep(0.001)


def concurrently(calls: list[Callable[[], object]], what: str, timeout: float = 30.0) -> list[object]:
    """Run ``calls`` on daemon threads and return their results in order; fail the test naming ``what`` if any
    has not returned after ``timeout`` seconds (a hung call is left behind instead of hanging the suite)."""
    import threading

    results: list[object] = [None] * len(calls)
    errors: list[BaseException] = []

    def run(k: int) -> None:
        try:
            results[k] = calls[k]()
        except BaseException as err:  # re-raised in the test's thread
            errors.append(err)

    threads = [threading.Thread(target=run, args=(k,), daemon=True) for k in range(len(calls))]
    for t in threads:
        t.start()
    deadline = time.monotonic() + timeout
    for t in threads:
        t.join(max(0.0, deadline - time.monotonic()))
    if any(t.is_alive() for t in threads):
        pytest.fail(f"timed out after {timeout:g} s waiting for {what}")
    if errors:
        raise errors[0]
    return results


def sigterm_under_load(proc, client: Callable[[int], Callable[[], str]], last: Callable[[str], bool], *,
                       clients: int = 16, before: int = 40, per_client: int = 200,
                       exit_timeout: float = 60.0) -> tuple[int, list[str]]:
    """Load a server process, SIGTERM it, and collect what the clients saw: (its exit status, every outcome).

    ``client(k)`` makes client k's request function (connections and payloads made once), which sends one request
    and returns its outcome in words; a client stops at an outcome where ``last(outcome)``, after ``per_client``
    requests, or once the server has exited. The signal goes once ``before`` outcomes are in.
    """
    import signal
    import threading

    outcomes: list[str] = []
    lock, stop = threading.Lock(), threading.Event()

    def run(k: int) -> None:
        send = client(k)
        for _ in range(per_client):  # bounded: at most per_client requests per client
            if stop.is_set():
                return
            outcome = send()
            with lock:
                outcomes.append(outcome)
            if last(outcome):
                return

    threads = [threading.Thread(target=run, args=(k,)) for k in range(clients)]
    for t in threads:
        t.start()
    wait_until(lambda: len(outcomes) >= before or proc.poll() is not None, "load to build up before the signal", 120)
    proc.send_signal(signal.SIGTERM)
    code = proc.wait(timeout=exit_timeout)
    stop.set()
    for t in threads:
        t.join(timeout=60)
    return code, outcomes
