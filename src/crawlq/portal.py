"""Runs coroutines from plain synchronous code on one private event loop.

A call runs the loop on the calling thread itself. Handing the coroutine to a loop kept
running on a thread of its own, and waiting for the answer, cost ~110 us a call here (two
thread wake-ups), two fifths of a single `app.schedule` on Redis; running the loop in place
costs ~15 (`python -m benchmarks.redis_floor` measures `app.schedule`).

Only one thread can run a loop at a time. A call made while another thread runs it is
handed to that run, which goes on until every call handed to it has its answer; the waiting
thread takes the loop over if the run ends before its answer comes. A thread that runs an
event loop of its own cannot run this one: a helper thread runs it for the call.

Between calls the loop stands still. What the backends leave on it (a connection kept for
the next call) needs no one to run it while no call waits on it.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Coroutine
from concurrent.futures import Future
from typing import Any, TypeVar

T = TypeVar("T")


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
        self._waiting: set[Future[Any]] = set()  # calls without their answer yet

    def _started(self) -> asyncio.AbstractEventLoop:
        with self._lock:
            if self._loop is None:
                self._loop = asyncio.new_event_loop()
            return self._loop

    @property
    def running(self) -> bool:
        """Whether the loop exists (a call made it, and `close` has not dropped it)."""
        return self._loop is not None

    def call(self, coro: Coroutine[Any, Any, T]) -> T:
        loop = self._started()
        own = _running_loop()
        if own is loop:
            coro.close()
            raise RuntimeError("Portal.call() from its own loop would deadlock")
        if own is None:
            with self._turn:
                free = self._runner is None
                if free:
                    self._runner = threading.get_ident()
            if free:
                try:
                    return loop.run_until_complete(coro)
                finally:
                    self._step_down()
        answer = asyncio.run_coroutine_threadsafe(coro, loop)
        with self._turn:
            self._waiting.add(answer)
        answer.add_done_callback(self._answered)
        if own is None:
            self._run(loop, until=answer.done)
        else:
            threading.Thread(
                target=self._run, args=(loop, answer.done), name="crawlq-portal", daemon=True
            ).start()
        return answer.result()

    def _answered(self, answer: Future[Any]) -> None:
        with self._turn:
            self._waiting.discard(answer)
            self._turn.notify_all()

    def _run(self, loop: asyncio.AbstractEventLoop, until: Callable[[], bool]) -> None:
        """Runs the loop on this thread, whenever no other thread does, until `until()`."""
        while True:
            with self._turn:
                while self._runner is not None and not until():
                    self._turn.wait()
                if until():
                    return
                self._runner = threading.get_ident()
            try:
                loop.run_until_complete(self._all_answered())
            finally:
                self._step_down()

    def _step_down(self) -> None:
        """Leaves the loop to a thread waiting for an answer that has not come."""
        with self._turn:
            self._runner = None
            self._turn.notify_all()

    async def _all_answered(self) -> None:
        """Returns once no call waits for an answer, those handed over meanwhile included."""
        while True:
            with self._turn:
                waiting = list(self._waiting)
            if not waiting:
                return
            await asyncio.wait([asyncio.wrap_future(answer) for answer in waiting])

    def close(self) -> None:
        """Drops the loop once no thread runs it: cancels what is left on it and closes it."""
        with self._lock:
            loop, self._loop = self._loop, None
        if loop is None:
            return
        with self._turn:
            while self._runner is not None:
                self._turn.wait()
        if _running_loop() is None:
            _shut(loop)
        else:
            helper = threading.Thread(target=_shut, args=(loop,), name="crawlq-portal-close")
            helper.start()
            helper.join()


def _shut(loop: asyncio.AbstractEventLoop) -> None:
    left = asyncio.all_tasks(loop)
    for task in left:
        task.cancel()
    if left:
        loop.run_until_complete(asyncio.gather(*left, return_exceptions=True))
    loop.run_until_complete(loop.shutdown_asyncgens())
    loop.run_until_complete(loop.shutdown_default_executor())
    loop.close()
