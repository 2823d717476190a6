"""kiln.serving.sessions: batches reach the engine sessions on the sessions' own threads."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from kiln.serving.sessions import Job, Sessions


def job(work) -> Job:
    return Job(work, asyncio.get_running_loop().create_future())


def test_a_finished_session_takes_the_waiting_batch_while_the_event_loop_is_busy():
    """The next batch starts on the session's thread as soon as the last one ends, not when the loop next runs."""
    release, second_started = threading.Event(), threading.Event()

    async def scenario():
        sessions = Sessions([lambda: "engine"])
        try:
            first = job(lambda engine: release.wait(10))
            second = job(lambda engine: second_started.set() or engine)
            sessions.dispatch(first)
            sessions.dispatch(second)  # no session is idle: it waits for the first to finish
            release.set()
            time.sleep(0.5)  # the event loop is busy (blocked) the whole time
            started_while_blocked = second_started.is_set()
            answers = [await asyncio.wait_for(j.done, 10) for j in (first, second)]
            return started_while_blocked, *answers
        finally:
            await asyncio.get_running_loop().run_in_executor(None, sessions.close)

    started_while_blocked, first, second = asyncio.run(scenario())
    assert started_while_blocked
    assert first is True and second == "engine"


def test_a_failing_batch_fails_its_awaiter_and_the_session_serves_on():
    def broken(engine):
        raise ValueError("the engine rejected the batch")

    async def scenario():
        sessions = Sessions([lambda: "engine"])
        try:
            failing = job(broken)
            sessions.dispatch(failing)
            with pytest.raises(ValueError, match="rejected"):
                await asyncio.wait_for(failing.done, 10)
            after = job(lambda engine: engine)
            sessions.dispatch(after)
            return await asyncio.wait_for(after.done, 10), sessions.idle
        finally:
            await asyncio.get_running_loop().run_in_executor(None, sessions.close)

    assert asyncio.run(scenario()) == ("engine", 1)


def test_the_lowest_idle_session_runs_first_and_a_solo_job_needs_every_session_idle():
    async def scenario():
        sessions = Sessions([lambda: "zero", lambda: "one"], solo="solo")
        hold = threading.Event()
        try:
            held = job(lambda engine: hold.wait(10) and engine)
            sessions.dispatch(held)  # session 0
            alone = Job(lambda engine: engine, asyncio.get_running_loop().create_future(), may_go_solo=True)
            sessions.dispatch(alone)  # session 1 is idle but session 0 is not: no solo
            ran_on = await asyncio.wait_for(alone.done, 10)
            hold.set()
            first = await asyncio.wait_for(held.done, 10)
            solo = Job(lambda engine: engine, asyncio.get_running_loop().create_future(), may_go_solo=True)
            sessions.dispatch(solo)
            return first, ran_on, await asyncio.wait_for(solo.done, 10), sessions.idle
        finally:
            await asyncio.get_running_loop().run_in_executor(None, sessions.close)

    assert asyncio.run(scenario()) == ("zero", "one", "solo", 2)


def test_small_jobs_queued_together_share_one_pool_turn_and_fail_alone():
    from kiln.serving.coalesce import CoalescingPool

    class Counting(CoalescingPool):
        turns = 0

        def submit(self, fn, /, *args, **kwargs):
            Counting.turns += 1
            return super().submit(fn, *args, **kwargs)

    def job(k):
        if k == 2:
            raise ValueError("job 2 is bad")
        return k * 10

    async def scenario():
        pool = Counting(max_workers=2)
        try:
            futures = [pool.coalesced(job, k) for k in range(5)]  # queued in one loop step
            first = await asyncio.gather(*futures, return_exceptions=True)
            later = await pool.coalesced(job, 7)  # the turn is over: the next job starts one of its own
            return first, later
        finally:
            pool.shutdown(wait=True)

    outcomes, later = asyncio.run(scenario())
    assert outcomes[:2] + outcomes[3:] == [0, 10, 30, 40] and isinstance(outcomes[2], ValueError)
    # The turn starts once the loop has run what was ready: all five shared it (one hop, not five).
    assert later == 70 and Counting.turns == 2


def test_jobs_queued_for_a_turn_of_a_pool_shut_down_meanwhile_fail_instead_of_hanging():
    from kiln.serving.coalesce import CoalescingPool

    async def scenario():
        pool = CoalescingPool(max_workers=1)
        futures = [pool.coalesced(abs, -k) for k in range(3)]
        pool.shutdown(wait=True)  # before the loop starts their turn
        return await asyncio.wait_for(asyncio.gather(*futures, return_exceptions=True), 10)

    outcomes = asyncio.run(scenario())
    assert all(isinstance(o, RuntimeError) and "shutdown" in str(o) for o in outcomes), outcomes
