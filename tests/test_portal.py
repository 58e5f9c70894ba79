"""The portal that runs the sync API's coroutines: on the caller's thread when it can, handed
to the thread running its loop when another does, on a helper thread from async code."""

from __future__ import annotations

import asyncio
import signal
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
    threads = [threading.Thread(target=target, args=(n,), daemon=True) for n in range(count)]
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

    other = threading.Thread(target=portal.call, args=(busy(),), daemon=True)
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

    threads = [threading.Thread(target=caller, args=(n,), daemon=True) for n in range(2)]
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


def test_a_call_made_while_close_runs_waits_for_it_then_runs_on_a_new_loop() -> None:
    """The running call's cleanup, which close's cancel starts, lets a new call begin; that
    call must not take the portal's next loop before close is done (close would then wait
    for it, and it for close)."""
    portal = Portal()
    running, new_call_made, closed = threading.Event(), threading.Event(), threading.Event()
    answers: dict[str, Any] = {}

    async def endless() -> None:
        running.set()
        try:
            await asyncio.Event().wait()
        finally:
            await waited(new_call_made)

    async def after_close() -> str:
        await waited(closed)
        return "on a new loop"

    def first() -> None:
        try:
            portal.call(endless())
        except RuntimeError as exc:
            answers["first"] = str(exc)

    def second() -> None:
        new_call_made.set()
        answers["second"] = portal.call(after_close())

    def closer() -> None:
        portal.close()
        closed.set()

    threads = [threading.Thread(target=first, daemon=True)]
    threads[0].start()
    assert running.wait(JOIN)
    threads += [threading.Thread(target=closer, daemon=True)]
    threads[1].start()
    while portal.running:  # close has dropped the loop: the next call makes a new one
        threading.Event().wait(0.001)
    threads += [threading.Thread(target=second, daemon=True)]
    threads[2].start()
    for thread in threads:
        thread.join(JOIN)
    try:
        assert not any(thread.is_alive() for thread in threads), "close or a call hung"
        assert answers == {
            "first": "the portal was closed during this call",
            "second": "on a new loop",
        }
    finally:
        portal.close()


def test_a_call_from_a_task_that_close_cancels_is_refused() -> None:
    portal = Portal()
    refused: list[str] = []

    async def other() -> None: ...

    async def endless() -> None:
        try:
            await asyncio.Event().wait()
        finally:
            try:
                portal.call(other())  # the sync API from a coroutine: a mistake
            except RuntimeError as exc:
                refused.append(str(exc))

    async def leave_a_task() -> None:
        leftovers.append(asyncio.create_task(endless()))
        await asyncio.sleep(0)

    leftovers: list[asyncio.Task[None]] = []
    portal.call(leave_a_task())
    closer = threading.Thread(target=portal.close, daemon=True)
    closer.start()
    closer.join(JOIN)
    assert not closer.is_alive(), "close hung"
    assert refused == ["Portal.call() from its own loop would deadlock"]


def test_the_main_threads_interrupt_handler_is_put_back_after_a_call() -> None:
    """Ours while the main thread runs the loop; after it, Python's default again, or the
    one the program installed meanwhile."""
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    portal = Portal()
    during: list[Any] = []

    def programs_own(signum: int, frame: Any) -> None: ...

    async def look(install: bool) -> None:
        during.append(signal.getsignal(signal.SIGINT))
        if install:
            signal.signal(signal.SIGINT, programs_own)

    try:
        portal.call(look(install=False))
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
        assert during[0] is not signal.default_int_handler
        portal.call(look(install=True))
        assert signal.getsignal(signal.SIGINT) is programs_own
    finally:
        signal.signal(signal.SIGINT, signal.default_int_handler)
        portal.close()


def test_an_interrupted_run_leaves_no_stop_for_the_next_or_for_close() -> None:
    """An interrupt that ends a run just after its call finished leaves the run's stop
    queued on the loop: the next call, and close, must run past it."""
    portal = Portal()
    cleaned = threading.Event()

    def interrupt() -> None:  # an interrupt landing in the loop's next step
        raise KeyboardInterrupt

    async def background() -> None:
        try:
            await asyncio.Event().wait()
        finally:
            cleaned.set()

    async def first() -> int:
        tasks.append(asyncio.create_task(background()))
        asyncio.get_running_loop().call_soon(interrupt)
        return 1

    async def second() -> str:
        return "ok"

    tasks: list[asyncio.Task[None]] = []
    with pytest.raises(KeyboardInterrupt):
        portal.call(first())
    assert portal.call(second()) == "ok"
    assert portal.call(second()) == "ok"
    portal.close()
    assert cleaned.is_set()


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
