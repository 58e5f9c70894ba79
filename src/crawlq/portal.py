"""Runs coroutines from plain synchronous code on one private event loop.

A call runs the loop on the calling thread itself. Handing the coroutine to a loop kept
running on a thread of its own, and waiting for the answer, cost ~110 us a call here (two
thread wake-ups), two fifths of a single `app.schedule` on Redis; running the loop in place
costs ~15, and ~22 with the Ctrl-C handling below (`python -m benchmarks.redis_floor`
measures `app.schedule`).

Only one thread can run a loop at a time. A call made while another thread runs it is
handed to that run, and its thread waits: for its answer, or for the run to end, and then
runs the loop itself until its answer comes (a thread never runs it longer, for calls made
after its own). A thread that runs an event loop of its own cannot run this one: a helper
thread runs it for the call.

Ctrl-C while the main thread runs the loop cancels the main thread's own call, which then
raises KeyboardInterrupt, as `asyncio.run` does: the loop may be running other threads'
calls too, and an interrupt raised in one of them would leave it half done.

`close` ends the calls under way (they raise RuntimeError) and takes the loop before any
call does: a call made meanwhile waits for it, then runs on a new loop.

Between calls the loop stands still. What the backends leave on it (a connection kept for
the next call) needs no one to run it while no call waits on it.
"""

from __future__ import annotations

import asyncio
import signal
import threading
import weakref
from collections.abc import Awaitable, Callable, Coroutine, Iterator
from concurrent.futures import CancelledError, Future
from contextlib import contextmanager
from functools import partial
from typing import Any, TypeVar

T = TypeVar("T")

#: What a call hears when `close` ended it or dropped its loop before it ran.
CLOSED = "the portal was closed during this call"
#: Rounds of cancelling what is left on the loop, for tasks that catch their cancellation.
CANCEL_ROUNDS = 3


def _running_loop() -> asyncio.AbstractEventLoop | None:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None


class Portal:
    """A private event loop; `call` blocks the calling thread until the coroutine ends."""

    def __init__(self) -> None:
        self._loop: asyncio.AbstractEventLoop | None = None
        self._lock = threading.Lock()  # making and dropping the loop
        self._turn = threading.Condition()  # who runs the loop; answers coming in
        self._runner: int | None = None  # the thread running the loop, if one is
        self._closing = 0  # closes under way: they run the loop before any call does
        self._made: weakref.WeakSet[asyncio.AbstractEventLoop] = weakref.WeakSet()

    def _started(self) -> asyncio.AbstractEventLoop:
        with self._lock:
            if self._loop is None:
                self._loop = asyncio.new_event_loop()
                self._made.add(self._loop)
            return self._loop

    def _from_own_loop(self) -> bool:
        """Whether the caller runs on a loop of this portal's (this one or one `close`
        dropped): waiting there for the portal would wait for itself."""
        own = _running_loop()
        return own is not None and own in self._made

    @property
    def running(self) -> bool:
        """Whether the loop exists (a call made it, and `close` has not dropped it)."""
        return self._loop is not None

    def call(self, coro: Coroutine[Any, Any, T]) -> T:
        if self._from_own_loop():
            coro.close()
            raise RuntimeError("Portal.call() from its own loop would deadlock")
        loop = self._started()
        own = _running_loop()
        try:
            return self._answer(loop, own, coro)
        except (asyncio.CancelledError, CancelledError):
            if loop is not self._loop:  # `close` dropped the loop and cancelled the call
                raise RuntimeError(CLOSED) from None
            raise

    def _answer(
        self,
        loop: asyncio.AbstractEventLoop,
        own: asyncio.AbstractEventLoop | None,
        coro: Coroutine[Any, Any, T],
    ) -> T:
        try:
            mine = own is None and self._take(loop)
            if not mine:
                answer = asyncio.run_coroutine_threadsafe(coro, loop)
        except RuntimeError:  # the loop is closed: `close` ran meanwhile
            coro.close()
            raise RuntimeError(CLOSED) from None
        if mine:
            try:
                task = loop.create_task(coro)
                with _interrupts_cancel(loop, task):
                    return _run_until_done(loop, task)
            finally:
                self._step_down()
        answer.add_done_callback(self._answered)
        if own is None:
            self._wait_or_run(loop, answer)
        else:
            self._on_helper(loop, answer)
        return answer.result()

    def _take(self, loop: asyncio.AbstractEventLoop) -> bool:
        """Makes this thread the loop's runner if no thread is."""
        with self._turn:
            if self._runner is not None or self._closing:
                return False
            if loop.is_closed():
                raise RuntimeError(CLOSED)
            self._runner = threading.get_ident()
            return True

    def _step_down(self) -> None:
        """Leaves the loop to a thread waiting for an answer that has not come."""
        with self._turn:
            self._runner = None
            self._turn.notify_all()

    def _answered(self, answer: Future[Any]) -> None:
        with self._turn:
            self._turn.notify_all()

    def _wait_or_run(self, loop: asyncio.AbstractEventLoop, answer: Future[Any]) -> None:
        """Waits for a handed-over call's answer, running the loop for it whenever no other
        thread does."""
        while True:
            with self._turn:
                while (self._runner is not None or self._closing) and not answer.done():
                    self._turn.wait()
                if answer.done():
                    return
            if self._take(loop):
                try:
                    with _interrupts_cancel(loop, answer):
                        _run_until_done(loop, asyncio.wrap_future(answer, loop=loop))
                finally:
                    self._step_down()

    def _on_helper(self, loop: asyncio.AbstractEventLoop, answer: Future[Any]) -> None:
        """`_wait_or_run` on a helper thread, for a caller that runs a loop of its own."""
        try:
            _on_thread(partial(self._wait_or_run, loop, answer), "crawlq-portal")
        except BaseException:
            if not answer.done():
                raise

    def close(self) -> None:
        """Drops the loop: cancels what is on it (calls under way then raise RuntimeError)
        and closes it."""
        if self._from_own_loop():
            raise RuntimeError("Portal.close() from its own loop would deadlock")
        with self._lock:
            loop, self._loop = self._loop, None
        if loop is None:
            return
        with self._turn:
            self._closing += 1  # from now on no call takes a loop before this close has
            if self._runner is not None:  # calls under way end now, as the loop is closed
                loop.call_soon_threadsafe(_cancel_all, loop)
            while self._runner is not None:
                self._turn.wait()
        try:
            if _running_loop() is None:
                _shut(loop)
            else:
                _on_thread(partial(_shut, loop), "crawlq-portal-close")
        finally:
            with self._turn:
                self._closing -= 1
                self._turn.notify_all()


def _on_thread(run: Callable[[], object], name: str) -> None:
    """`run()` on a thread of its own, for a caller whose thread runs another event loop;
    what it raises is raised here."""
    failed: list[BaseException] = []

    def guarded() -> None:
        try:
            run()
        except BaseException as exc:  # the caller raises it
            failed.append(exc)

    helper = threading.Thread(target=guarded, name=name, daemon=True)
    helper.start()
    helper.join()
    if failed:
        raise failed[0]


def _run_until_done(loop: asyncio.AbstractEventLoop, future: asyncio.Future[T]) -> T:
    """`run_until_complete`, run again if it ended early: a run that an interrupt ended just
    as its future was done leaves its stop behind, and that stop ends the next run."""
    while True:
        try:
            return loop.run_until_complete(future)
        except RuntimeError as exc:
            if future.done() or "stopped before Future completed" not in str(exc):
                raise


@contextmanager
def _interrupts_cancel(
    loop: asyncio.AbstractEventLoop, call: asyncio.Future[Any] | Future[Any]
) -> Iterator[None]:
    """While the main thread runs the loop: Ctrl-C cancels `call`, which raises
    KeyboardInterrupt, instead of an interrupt raised in whatever code the loop was running.
    A second Ctrl-C interrupts at once. Elsewhere, or with a handler of the program's own,
    nothing changes."""
    if (
        threading.current_thread() is not threading.main_thread()
        or signal.getsignal(signal.SIGINT) is not signal.default_int_handler
    ):
        yield
        return
    interrupted = False

    def on_interrupt(signum: int, frame: Any) -> None:
        nonlocal interrupted
        if interrupted or call.done():
            raise KeyboardInterrupt
        interrupted = True
        call.cancel()
        loop.call_soon_threadsafe(lambda: None)  # wakes the loop if it waits for I/O

    signal.signal(signal.SIGINT, on_interrupt)
    try:
        yield
    except asyncio.CancelledError:
        if interrupted:
            raise KeyboardInterrupt from None
        raise
    finally:
        if signal.getsignal(signal.SIGINT) is on_interrupt:  # not one the program set since
            signal.signal(signal.SIGINT, signal.default_int_handler)
    if interrupted:  # the call ended anyway, before the cancel reached it
        raise KeyboardInterrupt


def _cancel_all(loop: asyncio.AbstractEventLoop) -> set[asyncio.Task[Any]]:
    """Cancels every task on the loop; returns them."""
    tasks = asyncio.all_tasks(loop)
    for task in tasks:
        task.cancel()
    return tasks


def _shut(loop: asyncio.AbstractEventLoop) -> None:
    def run(step: Awaitable[Any]) -> None:
        _run_until_done(loop, asyncio.ensure_future(step, loop=loop))

    try:
        run(asyncio.sleep(0))  # calls handed over just now become tasks
        for _ in range(CANCEL_ROUNDS):
            left = _cancel_all(loop)
            if not left:
                break
            run(asyncio.gather(*left, return_exceptions=True))
        run(loop.shutdown_asyncgens())
    finally:
        loop.close()
