"""The engine sessions' threads, and how a batch reaches one without the event loop in between.

Each session (an engine instance) has one thread that runs its batches back to back. The batcher forms a batch
ahead while the sessions run (kiln.serving.batcher) and hands it over here: to an idle session's own inbox, else to
a shared queue that the next session to finish takes from *on its own thread*. Only the answer goes back to the
event loop. Before, a finished session handed its result to the loop and the loop handed it the next batch: two
thread hops through a loop busy with HTTP, 1.6-1.8 ms (median) between two calls of one session under 64 clients,
3.4-4.1% of each session's time idle, now 0.12 ms and ~0.5% (MiniLM int8, 2-core EPYC;
benchmarks/experiments/serve_ab/run.py at 91ffdaf, 4 alternations).

A job that may run on the predictor's *solo* session (all cores, for a request that found the server idle) does
so only when every session is idle and nothing waits; it then holds every session until it finishes, so that
one-thread batches never run beside an all-core one.
"""

from __future__ import annotations

import asyncio
import queue
import threading
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from kiln.engines.base import Engine
from kiln.log import get_logger
from kiln.serving.coalesce import resolve

log = get_logger("serve.sessions")


@dataclass(eq=False)
class Job:
    """``work(engine)`` runs on a session's thread; its return value (or error) settles ``done`` on its loop."""

    work: Callable[[Engine], Any]
    done: asyncio.Future
    may_go_solo: bool = False  # the batch's requests all found the server idle
    solo: bool = False  # decided at dispatch: it runs on the solo engine, holding every session
    held: list[_Session] = field(default_factory=list)  # the other sessions a solo job holds


class _Session:
    def __init__(self, engine: Callable[[], Engine], index: int) -> None:
        self.engine = engine  # read at call time (session 0 is the predictor's engine, which tests may wrap)
        self.index = index
        self.inbox: queue.SimpleQueue[Job | None] = queue.SimpleQueue()


class Sessions:
    """Engine sessions fed by :meth:`dispatch` (call it on the event loop that awaits the jobs)."""

    def __init__(self, engines: Sequence[Callable[[], Engine]], solo: Engine | None = None) -> None:
        self.solo = solo
        self._sessions = [_Session(engine, k) for k, engine in enumerate(engines)]
        self._lock = threading.Lock()  # guards _idle and _waiting, shared by the loop and every session thread
        self._idle: list[_Session] = list(self._sessions)  # in index order: the lowest idle session is used first
        self._waiting: deque[Job] = deque()  # formed batches no session was free for, oldest first
        # Daemon threads: sessions never closed (a test's, a crashed owner's) must not hold the interpreter at exit;
        # close() joins them.
        self._threads = [threading.Thread(target=self._serve, args=(s,), name=f"kiln-engine-{s.index}", daemon=True)
                         for s in self._sessions]
        for thread in self._threads:
            thread.start()

    def __len__(self) -> int:
        return len(self._sessions)

    @property
    def idle(self) -> int:
        """How many sessions have nothing to run."""
        with self._lock:
            return len(self._idle)

    def dispatch(self, job: Job) -> None:
        """Run ``job`` on the lowest idle session, else on the first session to finish (or as the solo job)."""
        with self._lock:
            if not self._idle:
                self._waiting.append(job)
                return
            if (job.may_go_solo and self.solo is not None and len(self._idle) == len(self._sessions)
                    and not self._waiting):
                session, *job.held = self._idle
                job.solo = True
                self._idle.clear()
            else:
                session = self._idle.pop(0)
        session.inbox.put(job)

    async def run_on(self, index: int, work: Callable[[Engine], Any]) -> Any:
        """``work(engine)`` on session ``index``'s own thread (warm-up: runtimes keep per-thread state), after
        whatever that session is running."""
        done = asyncio.get_running_loop().create_future()
        self._sessions[index].inbox.put(Job(work, done))
        return await done

    async def run_solo(self, work: Callable[[Engine], Any]) -> Any:
        """``work(solo engine)`` on session 0's thread (the solo engine's warm-up)."""
        done = asyncio.get_running_loop().create_future()
        self._sessions[0].inbox.put(Job(work, done, solo=True))
        return await done

    def close(self) -> None:
        """End every session's thread once it has run what it was given (call with no job left to dispatch)."""
        for session in self._sessions:
            session.inbox.put(None)
        for thread in self._threads:
            thread.join()

    def _serve(self, session: _Session) -> None:
        while (job := session.inbox.get()) is not None:
            while job is not None:
                engine = self.solo if job.solo and self.solo is not None else session.engine()
                try:
                    outcome: tuple[bool, Any] = (True, job.work(engine))
                except BaseException as err:  # noqa: BLE001 - the job's awaiter gets it; this thread must live on
                    outcome = (False, err)
                done, job = job.done, self._next(session, job)  # free first: its awaiter sees the sessions free
                _settle(done, *outcome)

    def _next(self, session: _Session, finished: Job) -> Job | None:
        """The job ``session`` runs next, taken here on its own thread; None: it goes idle. A finished solo job
        gives the sessions it held the waiting jobs (or back to idle)."""
        handed: list[tuple[_Session, Job]] = []
        with self._lock:
            for other in finished.held:
                if self._waiting:
                    handed.append((other, self._waiting.popleft()))
                else:
                    self._idle.append(other)
            job = self._waiting.popleft() if self._waiting else None
            if job is None and session not in self._idle:  # (a warm-up job ran on a session already idle)
                self._idle.append(session)
            self._idle.sort(key=lambda s: s.index)
        for other, waiting in handed:
            other.inbox.put(waiting)
        return job


def _settle(done: asyncio.Future, ok: bool, value: Any) -> None:
    """Hand a job's outcome to the loop that awaits it (nothing, if that loop is gone)."""
    try:
        done.get_loop().call_soon_threadsafe(resolve, done, ok, value)
    except RuntimeError:  # the loop is closed: nobody is waiting
        log.debug("a session finished a job after its event loop closed")
