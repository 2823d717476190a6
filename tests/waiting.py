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
