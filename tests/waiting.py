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
