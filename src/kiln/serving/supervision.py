"""A queue-owning asyncio task that is heard when it dies.

The batcher and the decode loop each own their queue from one asyncio task. An exception that escapes such a
task would otherwise end it unobserved: requests already queued wait forever and /ready keeps answering 200.
:class:`OwnedLoop` attaches a done-callback that fails every pending request with :class:`LoopDied` and tells its
owner (the served model: log, count, /ready off, and optionally restart), so a death is loud at once.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from kiln.log import get_logger

log = get_logger("serve.supervision")


class LoopDied(RuntimeError):
    """The loop that would have run this request died; the message names why."""


OnDeath = Callable[["OwnedLoop", BaseException], None]


class OwnedLoop:
    """Base of the loops that own a queue: ``start()`` runs ``_loop()`` as a supervised task.

    Subclasses implement ``_loop`` (returning normally only after ``close()``) and ``fail_pending`` (set ``err`` on
    every request that is queued or running and would otherwise never be answered).
    """

    kind = "loop"  # label in logs and metrics

    def __init__(self) -> None:
        self._task: asyncio.Task | None = None
        self._closing = False
        self.death: BaseException | None = None  # why the last run of the loop ended, when it did not close
        self._on_death: OnDeath = lambda loop, err: None

    def start(self, on_death: OnDeath | None = None) -> None:
        """Run the loop; ``on_death(loop, error)`` is called (on the event loop) if it ever ends unasked."""
        if on_death is not None:
            self._on_death = on_death
        self.death = None
        self._task = asyncio.get_running_loop().create_task(self._loop(), name=f"kiln-{self.kind}")
        self._task.add_done_callback(self._finished)

    @property
    def alive(self) -> bool:
        return self._task is not None and not self._task.done()

    def _finished(self, task: asyncio.Task) -> None:
        if task.cancelled():
            error: BaseException = asyncio.CancelledError(f"the {self.kind} loop was cancelled")
        elif task.exception() is not None:
            error = task.exception()  # type: ignore[assignment]
        elif self._closing:
            return  # a clean stop after close()
        else:
            error = RuntimeError(f"the {self.kind} loop returned without being closed")
        self.death = error
        self.fail_pending(LoopDied(f"the {self.kind} loop died ({type(error).__name__}: {error}); "
                                   "the request was not run"))
        try:
            self._on_death(self, error)
        except Exception:  # the owner's handler must not hide the death it was told about
            log.exception("the %s loop's death handler failed", self.kind)

    def check_alive(self) -> None:
        """Raise LoopDied when the loop is dead (a request submitted now would never be run)."""
        if self.death is not None:
            raise LoopDied(f"the {self.kind} loop is dead ({type(self.death).__name__}: {self.death})")

    async def _join(self) -> None:
        """Wait for the loop to end after ``close()``; a loop that died was already handled by ``_finished``."""
        if self._task is not None and not self._task.done():
            await asyncio.wait({self._task})

    async def _loop(self) -> None:
        raise NotImplementedError

    def fail_pending(self, err: Exception) -> None:
        raise NotImplementedError
