"""The embedded SQLite backend: the default, with nothing to install or run.

All SQLite work of one backend runs on one dedicated thread, so the event loop never blocks
on the disk or on another process's write lock.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import sqlite3
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import ParamSpec, TypeVar

from ...errors import BackendError, ConfigError
from ...types import (
    Claimed,
    ClaimResult,
    DeadLetter,
    ElementInfo,
    Failure,
    GroupStats,
    LimitRule,
    QueueConfig,
    QueueStats,
    Schedule,
    ScheduleResult,
    WorkerInfo,
)
from ...wakeup import Listener, WakeListener, WakeSender
from .engine import Engine
from .store import Store, translate

P = ParamSpec("P")
T = TypeVar("T")

DEFAULT_URL = "sqlite:///crawlq.db"

_Waiting = tuple[Sequence[Schedule], "asyncio.Future[ScheduleResult]"]
_Settled = tuple[_Waiting, ScheduleResult | BaseException]


def path_from_url(url: str) -> str:
    """sqlite:///relative.db and sqlite:////absolute/path.db, as SQLAlchemy spells them."""
    prefix = "sqlite:///"
    if not url.startswith(prefix) or len(url) == len(prefix):
        raise ConfigError(f"SQLite URL {url!r} must look like sqlite:///path/to/file.db")
    return url[len(prefix) :]


class SQLiteBackend:
    # An embedded file: what could undo a commit (a power loss) also ends every process
    # that remembers it.
    epoch = 0

    def __init__(
        self, url: str = DEFAULT_URL, *, clock: Callable[[], float] = time.time, create: bool = True
    ) -> None:
        self.url = url
        self.path = str(Path(path_from_url(url)).expanduser())
        self.now = clock
        self._create = create
        self._thread: ThreadPoolExecutor | None = None
        self._engine: Engine | None = None
        self._wake = WakeSender()
        self._lock = threading.Lock()
        self._schedules: list[_Waiting] = []  # batches the thread has not taken yet

    async def __aenter__(self) -> SQLiteBackend:
        await self.open()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def open(self) -> None:
        if self._thread is not None:
            return
        self._thread = ThreadPoolExecutor(1, thread_name_prefix="crawlq-sqlite")
        try:
            await self._call(self._connect)
        except BaseException:
            self._thread.shutdown()
            self._thread = None
            raise

    def _connect(self) -> None:
        self._engine = Engine(Store(self.path, create=self._create), self.now)

    async def close(self) -> None:
        if self._thread is None:
            return
        if self._engine is not None:
            await self._call(self._engine.store.close)
            self._engine = None
        self._thread.shutdown()
        self._thread = None
        self._wake.close()

    async def _call(self, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
        if self._thread is None:
            raise BackendError(f"backend {self.url} is not open")
        loop = asyncio.get_running_loop()
        try:
            return await loop.run_in_executor(self._thread, functools.partial(fn, *args, **kwargs))
        except sqlite3.Error as exc:
            raise translate(exc, self.path) from exc

    @property
    def engine(self) -> Engine:
        if self._engine is None:
            raise BackendError(f"backend {self.url} is not open")
        return self._engine

    async def _woken(self, call: Callable[[], tuple[T, list[str]]]) -> T:
        result, wake = await self._call(call)
        if wake:
            self._wake.send(wake)
        return result

    # -- the Backend protocol ----------------------------------------------------------------

    async def listen(self, queues: Sequence[str]) -> Listener:
        # Writers wake the addresses registered with these queues (register_worker).
        return WakeListener()

    async def ensure_queues(self, configs: Sequence[QueueConfig]) -> None:
        await self._call(self.engine.ensure_queues, configs)

    async def queues(self) -> list[QueueConfig]:
        return await self._call(self.engine.queues)

    async def schedule(self, items: Sequence[Schedule]) -> ScheduleResult:
        """Group-committed: the thread applies every batch waiting when it comes round in one
        transaction, each with its own result (a failure there has each batch tried alone)."""
        if not items:
            return ScheduleResult()
        if self._thread is None:
            raise BackendError(f"backend {self.url} is not open")
        future: asyncio.Future[ScheduleResult] = asyncio.get_running_loop().create_future()
        with self._lock:
            self._schedules.append((items, future))
            first = len(self._schedules) == 1
        if first:
            self._thread.submit(self._schedule_waiting)
        return await future

    def _schedule_waiting(self) -> None:
        with self._lock:
            taken, self._schedules = self._schedules, []
        # A call cancelled before its turn is not applied, as with run_in_executor.
        waiting = [(items, future) for items, future in taken if not future.cancelled()]
        if not waiting:
            return
        outcomes: list[ScheduleResult | BaseException] = []
        wake: list[str] = []
        try:
            results, wake = self.engine.schedule_batches([items for items, _ in waiting])
            outcomes += results
        except sqlite3.OperationalError as exc:  # the database's (locked, full), not a batch's
            outcomes += [self._error(exc) for _ in waiting]
        except Exception:  # the batch that raised fails alone
            for items, _ in waiting:
                try:
                    result, woken = self.engine.schedule(items)
                except Exception as exc:
                    outcomes.append(self._error(exc))
                else:
                    outcomes.append(result)
                    wake += woken
        # Each future is settled on its own loop (callers may come from more than one); the
        # first of them sends the wake-ups, as every other call does, from a loop.
        by_loop: dict[asyncio.AbstractEventLoop, list[_Settled]] = {}
        for entry, outcome in zip(waiting, outcomes, strict=True):
            by_loop.setdefault(entry[1].get_loop(), []).append((entry, outcome))
        for loop, settled in by_loop.items():
            with contextlib.suppress(RuntimeError):  # that loop is closed: no one waits there
                loop.call_soon_threadsafe(self._settle_schedules, settled, wake)
                wake = []

    def _error(self, exc: Exception) -> Exception:
        """A driver error as the crawlq error `_call` raises."""
        if not isinstance(exc, sqlite3.Error):
            return exc
        error = translate(exc, self.path)
        error.__cause__ = exc
        return error

    def _settle_schedules(self, settled: list[_Settled], wake: list[str]) -> None:
        if wake:
            self._wake.send(dict.fromkeys(wake))
        for (_, future), outcome in settled:
            if future.done():  # cancelled meanwhile
                continue
            if isinstance(outcome, BaseException):
                future.set_exception(outcome)
            else:
                future.set_result(outcome)

    async def claim(
        self, queues: Sequence[str], *, worker: str, limit: int, lease: float
    ) -> ClaimResult:
        return await self._woken(functools.partial(self.engine.claim, queues, worker, limit, lease))

    async def ack(self, elements: Sequence[Claimed]) -> None:
        if elements:
            self._wake.send(await self._call(self.engine.ack, elements))

    async def fail(self, failures: Sequence[Failure]) -> None:
        if failures:
            self._wake.send(await self._call(self.engine.fail, failures))

    async def finish(
        self, follow: Sequence[Schedule], acks: Sequence[Claimed], failures: Sequence[Failure]
    ) -> None:
        if follow or acks or failures:
            self._wake.send(await self._call(self.engine.finish, follow, acks, failures))

    async def release(self, elements: Sequence[Claimed]) -> None:
        if elements:
            self._wake.send(await self._call(self.engine.release, elements))

    async def heartbeat(
        self, worker: WorkerInfo, elements: Sequence[Claimed], lease: float
    ) -> None:
        await self._call(self.engine.heartbeat, worker, elements, lease)

    async def register_worker(self, worker: WorkerInfo) -> None:
        await self._call(self.engine.register_worker, worker)

    async def unregister_worker(self, worker_id: str) -> None:
        await self._call(self.engine.unregister_worker, worker_id)

    async def workers(self) -> list[WorkerInfo]:
        return await self._call(self.engine.workers)

    async def limits(self) -> list[LimitRule]:
        return await self._call(self.engine.limits)

    async def set_limits(self, rules: Sequence[LimitRule]) -> None:
        await self._woken(functools.partial(self.engine.set_limits, rules))

    async def delete_limit(self, pattern: str) -> bool:
        return await self._woken(functools.partial(self.engine.set_limits, (), pattern))

    async def block_group(self, group: str, until: float | None, reason: str | None) -> None:
        self._wake.send(await self._call(self.engine.block_group, group, until, reason))

    async def reserve_send(self, group: str, gap: float, earliest: float = 0.0) -> float:
        return (await self.reserve_send_slot(group, gap, earliest))[1]

    async def reserve_send_slot(
        self, group: str, gap: float, earliest: float = 0.0, *, replacing: float | None = None
    ) -> tuple[float, float, bool]:
        slot: tuple[float, float, bool] = await self._call(
            self.engine.reserve_send, group, gap, earliest, replacing
        )
        return slot

    async def queue_stats(self, queues: Sequence[str] | None = None) -> list[QueueStats]:
        return await self._call(self.engine.queue_stats, queues)

    async def group_stats(
        self, pattern: str = "*", *, limit: int = 100, include_idle: bool = False
    ) -> list[GroupStats]:
        return await self._call(self.engine.group_stats, pattern, limit, include_idle)

    async def element(self, queue: str, key: str) -> ElementInfo | None:
        return await self._call(self.engine.element, queue, key)

    async def worker_elements(self, worker_id: str, *, limit: int = 50) -> list[ElementInfo]:
        return await self._call(self.engine.worker_elements, worker_id, limit)

    async def check(self) -> list[str]:
        return await self._call(self.engine.check)

    async def dead_letters(
        self, queue: str, *, limit: int = 100, offset: int = 0
    ) -> list[DeadLetter]:
        return await self._call(self.engine.dead_letters, queue, limit, offset)

    async def requeue_dead(self, queue: str, keys: Sequence[str] | None = None) -> int:
        return await self._woken(functools.partial(self.engine.take_dead, queue, keys, True))

    async def purge_dead(self, queue: str, keys: Sequence[str] | None = None) -> int:
        count, _ = await self._call(self.engine.take_dead, queue, keys, False)
        return count
