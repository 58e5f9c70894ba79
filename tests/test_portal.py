"""The portal that runs the sync API's coroutines: on the caller's thread when it can, handed
to the thread running its loop when another does, on a helper thread from async code."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest

from crawlq import App, Context
from crawlq.portal import Portal

#: Seconds a test's threads get to finish: far more than any needs, so only a hang fails.
JOIN = 30.0
THREADS = 8


def run_threads(count: int, target: Any) -> None:
    threads = [threading.Thread(target=target, args=(n,)) for n in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(JOIN)
    assert not any(thread.is_alive() for thread in threads), "a call never got its answer"


def test_a_call_runs_on_the_calling_thread() -> None:
    portal = Portal()

    async def where() -> tuple[int, asyncio.AbstractEventLoop]:
        return threading.get_ident(), asyncio.get_running_loop()

    try:
        thread, loop = portal.call(where())
        assert thread == threading.get_ident()
        assert portal.call(where())[1] is loop  # the same loop every call
    finally:
        portal.close()


def test_calls_from_many_threads_at_once_share_one_run_of_the_loop() -> None:
    """Every call waits until all have started, so all of them are on the loop at once: the
    thread that runs it runs the calls the others handed over, until each has its answer."""
    portal = Portal()
    started: list[int] = []
    everyone_in: dict[str, asyncio.Event] = {}
    answers: dict[int, int] = {}

    async def meet(n: int) -> int:
        event = everyone_in.setdefault("event", asyncio.Event())
        started.append(n)
        if len(started) == THREADS:
            event.set()
        await event.wait()
        return n * 10

    def caller(n: int) -> None:
        answers[n] = portal.call(meet(n))

    try:
        run_threads(THREADS, caller)
    finally:
        portal.close()
    assert answers == {n: n * 10 for n in range(THREADS)}


def test_a_waiting_thread_takes_the_loop_over_when_the_running_one_is_done() -> None:
    """The thread running the loop returns with its own answer while another call is still
    under way; that call's thread runs the loop for it."""
    portal = Portal()
    first_running = threading.Event()
    handed_over = threading.Event()
    first_returned = threading.Event()
    loops: list[asyncio.AbstractEventLoop] = []

    async def first() -> str:
        loops.append(asyncio.get_running_loop())
        first_running.set()
        await asyncio.to_thread(handed_over.wait, JOIN)
        return "first"

    async def second() -> str:
        handed_over.set()
        await asyncio.to_thread(first_returned.wait, JOIN)  # only after first's call returned
        loops.append(asyncio.get_running_loop())
        finished_on.append(threading.get_ident())
        return "second"

    answers: dict[int, str] = {}
    finished_on: list[int] = []
    second_caller: list[int] = []

    def caller(n: int) -> None:
        if n == 0:
            answers[0] = portal.call(first())
            first_returned.set()
        else:
            first_running.wait(JOIN)  # the first call runs the loop before the second is made
            second_caller.append(threading.get_ident())
            answers[1] = portal.call(second())

    try:
        run_threads(2, caller)
    finally:
        portal.close()
    assert answers == {0: "first", 1: "second"}
    assert loops[0] is loops[1]
    assert finished_on == second_caller


async def test_a_call_from_async_code_runs_on_a_helper_thread() -> None:
    portal = Portal()

    async def where() -> int:
        return threading.get_ident()

    try:
        assert portal.call(where()) != threading.get_ident()
    finally:
        portal.close()


def test_a_call_from_the_portals_own_loop_is_refused() -> None:
    portal = Portal()

    async def inner() -> None: ...

    async def outer() -> None:
        portal.call(inner())

    try:
        with pytest.raises(RuntimeError, match="would deadlock"):
            portal.call(outer())
    finally:
        portal.close()


def test_a_failed_call_leaves_the_loop_to_the_next() -> None:
    portal = Portal()

    async def fail() -> None:
        raise ValueError("no")

    async def answer() -> int:
        return 42

    try:
        with pytest.raises(ValueError, match="no"):
            portal.call(fail())
        assert portal.call(answer()) == 42
    finally:
        portal.close()


def test_close_cancels_what_is_left_and_a_later_call_starts_a_new_loop() -> None:
    portal = Portal()
    cancelled = threading.Event()

    async def forever() -> None:
        try:
            await asyncio.Event().wait()
        finally:
            cancelled.set()

    async def leave_a_task() -> asyncio.AbstractEventLoop:
        leftovers.append(asyncio.create_task(forever()))
        await asyncio.sleep(0)
        return asyncio.get_running_loop()

    leftovers: list[asyncio.Task[None]] = []
    first = portal.call(leave_a_task())
    portal.close()
    assert cancelled.is_set()
    assert first.is_closed()
    assert not portal.running
    try:
        assert portal.call(leave_a_task()) is not first
    finally:
        portal.close()


def test_sync_schedules_from_many_threads_all_land(url: str) -> None:
    """A web app's request threads each scheduling through the sync API, on both backends."""
    app = App(url)

    @app.task(group=None)
    async def job(ctx: Context, n: int) -> None: ...

    per_thread = 25
    added: list[int] = []

    def caller(n: int) -> None:
        for k in range(per_thread):
            added.append(app.schedule(job, n * per_thread + k).added)

    with app:
        run_threads(THREADS, caller)
        (stats,) = app.stats(["job"])
    assert sum(added) == THREADS * per_thread
    assert stats.total == THREADS * per_thread
