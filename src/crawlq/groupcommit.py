"""Group commit: many calls from event loops, whose disk work one thread does in batches.

A crawl writes hundreds of small things a second (a response to its WARC file, a page's links
to its budget). Written one by one, each pays a thread hop, a flush or a transaction of its
own; here the thread takes every item waiting when it comes round and hands them to `apply`
together, so a busy second costs a few writes, not hundreds.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Generic, TypeVar

I = TypeVar("I")  # noqa: E741 (an item, as R is a result)
R = TypeVar("R")
T = TypeVar("T")

_Settled = list[tuple[asyncio.Future[R], R | BaseException]]


class GroupCommit(Generic[I, R]):
    """`await commit(item)` is the outcome `apply` gave that item: `apply(items)` returns one
    result or exception per item, and an exception it raises fails every item of its batch.
    A call cancelled before its batch was taken is left out of it.

    The thread is this object's own: `run` puts other work on it, in turn with the batches
    (reads of what the batches wrote, closing the files). It starts with the first call, and
    again with the first call after `close`."""

    def __init__(self, apply: Callable[[list[I]], Sequence[R | BaseException]], name: str):
        self._apply = apply
        self._name = name
        self._thread: ThreadPoolExecutor | None = None
        self._lock = threading.Lock()
        self._pending: list[tuple[I, asyncio.Future[R]]] = []
        self._draining = False

    def _executor(self) -> ThreadPoolExecutor:
        with self._lock:
            if self._thread is None:
                self._thread = ThreadPoolExecutor(1, thread_name_prefix=self._name)
            return self._thread

    async def __call__(self, item: I) -> R:
        future: asyncio.Future[R] = asyncio.get_running_loop().create_future()
        thread = self._executor()
        with self._lock:
            self._pending.append((item, future))
            start = not self._draining
            self._draining = True
        if start:
            thread.submit(self._drain)
        return await future

    async def run(self, fn: Callable[..., T], *args: object) -> T:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor(), functools.partial(fn, *args))

    def submit(self, fn: Callable[[], T]) -> Future[T]:
        """`run` for a caller outside the event loop."""
        return self._executor().submit(fn)

    @property
    def waiting(self) -> int:
        """Items whose batch has not been taken yet."""
        with self._lock:
            return len(self._pending)

    async def close(self, last: Callable[[], None] | None = None) -> None:
        """Runs `last` (closing files) after every batch already waiting, then ends the
        thread. Closing what is closed does nothing."""
        with self._lock:
            thread, self._thread = self._thread, None
        if thread is None:
            return
        loop = asyncio.get_running_loop()
        if last is not None:
            await loop.run_in_executor(thread, last)
        await asyncio.to_thread(thread.shutdown)

    def _drain(self) -> None:
        while True:
            with self._lock:
                taken, self._pending = self._pending, []
                if not taken:
                    self._draining = False
                    return
            batch = [(item, future) for item, future in taken if not future.cancelled()]
            if not batch:
                continue
            outcomes: Sequence[R | BaseException]
            try:
                outcomes = self._apply([item for item, _ in batch])
            except BaseException as exc:
                outcomes = [exc] * len(batch)
            # Each future is settled on its own loop: callers may come from more than one.
            by_loop: dict[asyncio.AbstractEventLoop, _Settled[R]] = {}
            for (_, future), outcome in zip(batch, outcomes, strict=True):
                by_loop.setdefault(future.get_loop(), []).append((future, outcome))
            for loop, settled in by_loop.items():
                with contextlib.suppress(RuntimeError):  # that loop is closed: no one waits
                    loop.call_soon_threadsafe(_settle, settled)


def _settle(settled: _Settled[R]) -> None:
    """Hands each future its outcome, a result or an exception (on the future's loop)."""
    for future, outcome in settled:
        if future.done():  # cancelled meanwhile
            continue
        if isinstance(outcome, BaseException):
            future.set_exception(outcome)
        else:
            future.set_result(outcome)
