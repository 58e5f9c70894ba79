"""The portal that runs the sync API's coroutines: on the caller's thread when it can, handed
to the thread running its loop when another does, on a helper thread from async code."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import threading
from typing import Any

import pytest

from crawlq import App, Context
from crawlq.portal import Portal

#: Seconds a test's threads get to finish: far more than any needs, so only a hang fails.
JOIN = 30.0
THREADS = 8

pytestmark = pytest.mark.timeout(90)  # a hang fails its own test, not the run


async def waited(event: threading.Event) -> None:
    """Waits for a thread's event without holding up the loop; fails if it never comes."""
    assert await asyncio.to_thread(event.wait, JOIN), "the event never came"


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
    others' calls are handed to the run of the thread that runs it."""
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


def test_waiting_threads_take_the_loop_over_each_until_its_own_answer() -> None:
    """The thread running the loop returns with its own answer while two calls handed to its
    run are under way; their threads run the loop for them, each only until its own answer:
    the second call can end only once the first has returned, the third only once the second
    has, so a thread that ran the loop for every call handed to it would wait forever."""
    portal = Portal()
    events = {name: threading.Event() for name in ("running", "second", "third", "returned")}
    second_returned = threading.Event()
    ran_on: dict[str, int] = {}

    async def first() -> str:
        events["running"].set()
        await waited(events["third"])  # both others handed over
        ran_on["first"] = threading.get_ident()
        return "first"

    async def second() -> str:
        events["second"].set()
        await waited(events["returned"])
        ran_on["second"] = threading.get_ident()
        return "second"

    async def third() -> str:
        events["third"].set()
        await waited(second_returned)
        ran_on["third"] = threading.get_ident()
        return "third"

    answers: dict[int, str] = {}
    callers: dict[int, int] = {}

    def caller(n: int) -> None:
        callers[n] = threading.get_ident()
        if n == 0:
            answers[0] = portal.call(first())
            events["returned"].set()
        elif n == 1:
            events["running"].wait(JOIN)  # the first call runs the loop before the others
            answers[1] = portal.call(second())
            second_returned.set()
        else:
            events["second"].wait(JOIN)
            answers[2] = portal.call(third())

    try:
        run_threads(3, caller)
    finally:
        portal.close()
    assert answers == {0: "first", 1: "second", 2: "third"}
    assert ran_on["first"] == callers[0]
    assert {ran_on["second"], ran_on["third"]} <= {callers[1], callers[2]}


def test_a_handed_over_call_returns_while_the_running_thread_is_still_busy() -> None:
    """Its answer wakes its thread at once: the running thread's own call ends only after
    the handed-over call has returned."""
    portal = Portal()
    running = threading.Event()
    other_returned = threading.Event()

    async def busy() -> str:
        running.set()
        await waited(other_returned)
        return "busy"

    async def quick() -> str:
        return "quick"

    answers: dict[int, str] = {}

    def caller(n: int) -> None:
        if n == 0:
            answers[0] = portal.call(busy())
        else:
            running.wait(JOIN)
            answers[1] = portal.call(quick())
            other_returned.set()

    try:
        run_threads(2, caller)
    finally:
        portal.close()
    assert answers == {0: "busy", 1: "quick"}


async def test_a_call_from_async_code_runs_on_a_helper_thread() -> None:
    portal = Portal()

    async def where() -> int:
        return threading.get_ident()

    try:
        assert portal.call(where()) != threading.get_ident()
    finally:
        portal.close()


async def test_a_call_from_async_code_is_answered_by_the_thread_running_the_loop() -> None:
    portal = Portal()
    running = threading.Event()
    release = threading.Event()

    async def busy() -> None:
        running.set()
        await waited(release)

    async def quick() -> str:
        return "quick"

    other = threading.Thread(target=portal.call, args=(busy(),))
    other.start()
    try:
        assert running.wait(JOIN)
        assert portal.call(quick()) == "quick"
    finally:
        release.set()
        other.join(JOIN)
        portal.close()
    assert not other.is_alive()


def test_close_ends_the_calls_under_way_and_the_portal_works_again() -> None:
    """One thread runs the loop for a call that never ends, another's such call is handed to
    that run: `close` cancels both, and each caller hears that the portal closed."""
    portal = Portal()
    started = {n: threading.Event() for n in range(2)}
    raised: dict[int, str] = {}

    async def endless(n: int) -> None:
        started[n].set()
        await asyncio.Event().wait()

    def caller(n: int) -> None:
        if n == 1:
            started[0].wait(JOIN)
        try:
            portal.call(endless(n))
        except RuntimeError as exc:
            raised[n] = str(exc)

    threads = [threading.Thread(target=caller, args=(n,)) for n in range(2)]
    for thread in threads:
        thread.start()
    assert all(started[n].wait(JOIN) for n in range(2))
    portal.close()
    for thread in threads:
        thread.join(JOIN)
    assert raised == {n: "the portal was closed during this call" for n in range(2)}

    async def answer() -> int:
        return 42

    try:
        assert portal.call(answer()) == 42
    finally:
        portal.close()


#: Run in a child process, whose main thread gets the SIGINT: Ctrl-C while the main thread
#: runs the loop for its own call and, at that very moment, another thread's.
CTRL_C = """
import asyncio, signal, threading
from crawlq.portal import Portal

portal = Portal()
main_started, other_started = threading.Event(), threading.Event()

async def endless():
    main_started.set()
    await asyncio.Event().wait()

async def other_call():
    other_started.set()
    while not sent.is_set():  # running, on the main thread, when the interrupt comes
        pass
    for _ in range(100_000):
        pass
    await asyncio.to_thread(interrupted.wait, 30)
    return "other done"

interrupted, sent = threading.Event(), threading.Event()
answers = []

def other():
    main_started.wait(30)
    answers.append(portal.call(other_call()))

def press_ctrl_c():
    other_started.wait(30)
    signal.pthread_kill(threading.main_thread().ident, signal.SIGINT)
    sent.set()

helpers = [threading.Thread(target=other), threading.Thread(target=press_ctrl_c)]
for thread in helpers:
    thread.start()
try:
    portal.call(endless())
except KeyboardInterrupt:
    print("main: KeyboardInterrupt")
interrupted.set()
for thread in helpers:
    thread.join(30)
print("other:", answers)

async def answer():
    return 42

print("later:", portal.call(answer()))
portal.close()
print("closed")
"""


def test_ctrl_c_cancels_the_main_threads_call_and_no_other() -> None:
    done = subprocess.run(
        [sys.executable, "-c", CTRL_C], capture_output=True, text=True, timeout=JOIN
    )
    assert done.stdout.splitlines() == [
        "main: KeyboardInterrupt",
        "other: ['other done']",
        "later: 42",
        "closed",
    ], done.stderr


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
