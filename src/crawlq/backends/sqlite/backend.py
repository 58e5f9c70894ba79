"""The embedded SQLite backend: the default, with nothing to install or run.

The connection has one user at a time: the event loop or the backend's own thread. The calls
a worker makes all the time (claims, acks, a page's links, heartbeats, robots.txt answers)
run at once on the event loop when the connection is free and no other process has the
write turn: a claim of a hundred takes a few milliseconds, less than handing it to a thread
costs in a busy process, where each statement gives up the GIL and waits to take it back.
A page's links wait for the loop's next turn, so that every batch handed over meanwhile goes
in one transaction. The rest (big batches, reports, opening and closing), any call that would
wait for another process's write turn or another program's lock, and the copy of a long
log's rest (it syncs the file) run on the thread: the event loop never waits for another
process. (SQLite's own automatic checkpoint, the bound should the checkpointer fall far
behind, may still come in a commit made on the loop.)
"""

from __future__ import annotations

import asyncio
import functools
import sqlite3
import threading
import time
from collections.abc import Awaitable, Callable, Collection, Mapping, Sequence
from pathlib import Path
from typing import ParamSpec, TypeVar

from ...errors import BackendError, ConfigError
from ...groupcommit import GroupCommit
from ...limits import checked_crawl_delays
from ...observe.logs import redact
from ...types import (
    Claimed,
    ClaimResult,
    DeadLetter,
    ElementInfo,
    Failure,
    GroupStats,
    Leases,
    LimitRule,
    QueueConfig,
    QueueStats,
    Schedule,
    ScheduleResult,
    WorkerInfo,
)
from ...wakeup import Listener, WakeListener, WakeSender
from ...writelock import TurnTaken
from ..batch import (
    check_block_until,
    check_failures,
    check_leases,
    check_robots_answer,
    check_schedule,
)
from .engine import Engine
from .store import Store, busy, translate

P = ParamSpec("P")
T = TypeVar("T")

DEFAULT_URL = "sqlite:///crawlq.db"

_Scheduled = tuple[ScheduleResult, list[str]]  # and the addresses to wake for it
_Soon = list[tuple[Sequence[Schedule], "asyncio.Future[_Scheduled | _Later]"]]

#: Batches of at most this many elements, and claims of at most this many, may run on the
#: event loop (a few milliseconds); bigger ones go to the thread.
AT_ONCE_ITEMS = 1000
#: Seconds between the tries of a call to run on the event loop, when the connection or the
#: write turn was taken (another process's claim holds it a few milliseconds). After the
#: last, it waits for its turn on the thread.
AGAIN_AFTER = (0.001, 0.002, 0.004, 0.008)


class _Later:
    """What a call that could not run at once returns: it goes to the thread."""


LATER = _Later()


async def _tried(attempt: Callable[[], Awaitable[T | _Later]]) -> T | _Later:
    """`attempt()`, made again after each pause of AGAIN_AFTER while it could not run at once
    (LATER); LATER if it never could."""
    result = await attempt()
    for pause in AGAIN_AFTER:
        if not isinstance(result, _Later):
            break
        await asyncio.sleep(pause)
        result = await attempt()
    return result


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
        self._thread: GroupCommit[Sequence[Schedule], _Scheduled] | None = None
        self._engine: Engine | None = None
        self._wake = WakeSender()
        self._busy = threading.Lock()  # the connection's one user, the loop or the thread
        self._soon: dict[asyncio.AbstractEventLoop, _Soon] = {}  # batches for the loop's turn
        self._log_handed = False  # finish_log is on the thread's way

    async def __aenter__(self) -> SQLiteBackend:
        await self.open()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def open(self) -> None:
        if self._thread is not None:
            return
        self._thread = GroupCommit(self._schedule_all_on_thread, "crawlq-sqlite")
        try:
            await self._call(self._connect)
        except BaseException:
            await self._thread.close()
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
        await self._thread.close()
        self._thread = None
        self._wake.close()

    async def _call(self, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
        """`fn` on the thread."""
        return await self._on_thread(functools.partial(self._locked, fn, *args, **kwargs))

    async def _on_thread(self, job: Callable[[], T]) -> T:
        if self._thread is None:
            raise BackendError(f"backend {self.url} is not open")
        try:
            return await self._thread.run(job)
        except sqlite3.Error as exc:
            raise translate(exc, self.path) from exc

    def _locked(self, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
        with self._busy:
            if self._engine is not None:
                self._engine.store.patient = True
            return fn(*args, **kwargs)

    async def _quick(self, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
        """`fn` on the event loop as soon as it can run there without waiting, or if it
        cannot for a while, on the thread."""
        call = functools.partial(fn, *args, **kwargs)

        async def now() -> T | _Later:
            return self._now(call)

        result = await _tried(now)
        if isinstance(result, _Later):
            return await self._on_thread(functools.partial(self._after_turn, call))
        return result

    async def _by_size(
        self, count: int, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs
    ) -> T:
        """`_quick` for calls of at most AT_ONCE_ITEMS elements, `_call` for bigger ones."""
        if count <= AT_ONCE_ITEMS:
            return await self._quick(fn, *args, **kwargs)
        return await self._call(fn, *args, **kwargs)

    def _after_turn(self, call: Callable[[], T]) -> T:
        """`call()` on the thread, once no other process has the write turn: the wait is not
        made holding the connection, which the loop may use meanwhile."""
        self.engine.store.wait_for_turn()
        return self._locked(call)

    def _now(self, fn: Callable[[], T]) -> T | _Later:
        """`fn()` on this thread if the connection is free and no other process has the write
        turn; LATER (having done nothing) if not."""
        engine = self._engine
        if engine is None or not self._busy.acquire(blocking=False):
            return LATER
        store = engine.store
        handed = False
        try:
            store.patient = False
            try:
                return fn()
            except TurnTaken:
                return LATER
            except sqlite3.Error as exc:
                if busy(exc):  # a read that met another program's lock
                    return LATER
                raise translate(exc, self.path) from exc
            finally:
                handed = store.log_handed_over and not self._log_handed
                self._log_handed |= handed
        finally:
            self._busy.release()
            if handed and self._thread is not None:
                self._thread.submit(functools.partial(self._locked, self._finish_log, store))

    def _finish_log(self, store: Store) -> None:
        self._log_handed = False
        store.finish_log()

    @property
    def engine(self) -> Engine:
        if self._engine is None:
            raise BackendError(f"backend {self.url} is not open")
        return self._engine

    async def _woken(self, call: Callable[[], tuple[T, list[str]]], *, count: int = -1) -> T:
        """The call's result, its wake-ups sent; on the thread, unless `count` (its elements)
        lets `_by_size` try the loop first."""
        result, wake = await (self._by_size(count, call) if count >= 0 else self._call(call))
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
        for item in items:
            check_schedule(item)
        if self._thread is None:
            raise BackendError(f"backend {self.url} is not open")
        done: _Scheduled | _Later = LATER
        if len(items) <= AT_ONCE_ITEMS:
            done = await _tried(functools.partial(self._schedule_soon, items))
        if isinstance(done, _Later):
            if self._thread is None:  # closed while it tried
                raise BackendError(f"backend {self.url} is not open")
            done = await self._thread(items)
        result, wake = done
        if wake:
            self._wake.send(dict.fromkeys(wake))
        return result

    def _schedule_soon(self, items: Sequence[Schedule]) -> asyncio.Future[_Scheduled | _Later]:
        """The batch's outcome at the loop's next turn, with the batches handed over meanwhile
        in one transaction of at most AT_ONCE_ITEMS elements (more start another, which runs
        in a callback of its own); LATER if that transaction could not run at once."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[_Scheduled | _Later] = loop.create_future()
        waiting = self._soon.get(loop)
        if waiting is None or sum(len(i) for i, _ in waiting) + len(items) > AT_ONCE_ITEMS:
            waiting = self._soon[loop] = []
            loop.call_soon(self._run_soon, loop, waiting)
        waiting.append((items, future))
        return future

    def _run_soon(self, loop: asyncio.AbstractEventLoop, waiting: _Soon) -> None:
        if self._soon.get(loop) is waiting:
            del self._soon[loop]
        taken = [(items, f) for items, f in waiting if not f.cancelled()]
        if not taken:
            return
        outcomes: Sequence[_Scheduled | BaseException] | _Later
        try:
            outcomes = self._now(functools.partial(self._schedule_all, [i for i, _ in taken]))
        except BaseException as exc:  # every caller hears of it: none may wait forever
            outcomes = [exc] * len(taken)
        for index, (_, future) in enumerate(taken):
            if future.done():
                continue
            if isinstance(outcomes, _Later) or isinstance(outcomes[index], TurnTaken):
                future.set_result(LATER)  # not applied: it tries again, or goes to the thread
            elif isinstance(outcome := outcomes[index], BaseException):
                future.set_exception(outcome)
            else:
                future.set_result(outcome)

    def _schedule_all_on_thread(
        self, batches: list[Sequence[Schedule]]
    ) -> list[_Scheduled | Exception]:
        return self._after_turn(functools.partial(self._schedule_all, batches))

    def _schedule_all(self, batches: list[Sequence[Schedule]]) -> list[_Scheduled | Exception]:
        """The batches' results; the first of them carries all the wake-ups, sent once."""
        try:
            results, wake = self.engine.schedule_batches(batches)
        except TurnTaken:
            raise  # nothing done: the batches go to the thread
        except sqlite3.OperationalError as exc:  # the database's (locked, full), not a batch's
            return [self._error(exc) for _ in batches]
        except Exception:  # the batch that raised fails alone
            outcomes: list[_Scheduled | Exception] = []
            for items in batches:
                try:
                    outcomes.append(self.engine.schedule(items))
                except Exception as exc:
                    outcomes.append(self._error(exc))
            return outcomes
        return [(result, wake if n == 0 else []) for n, result in enumerate(results)]

    def _error(self, exc: Exception) -> Exception:
        """A driver error as the crawlq error `_call` raises."""
        if not isinstance(exc, sqlite3.Error):
            return exc
        error = translate(exc, self.path)
        error.__cause__ = exc
        return error

    async def claim(
        self, queues: Sequence[str], *, worker: str, limit: int, lease: Leases
    ) -> ClaimResult:
        check_leases(lease, queues)
        claim = functools.partial(self.engine.claim, queues, worker, limit, lease)
        return await self._woken(claim, count=limit)

    async def ack(self, elements: Sequence[Claimed]) -> None:
        if elements:
            self._wake.send(await self._by_size(len(elements), self.engine.ack, elements))

    async def fail(self, failures: Sequence[Failure]) -> None:
        check_failures(failures)
        if failures:
            self._wake.send(await self._by_size(len(failures), self.engine.fail, failures))

    async def finish(
        self, follow: Sequence[Schedule], acks: Sequence[Claimed], failures: Sequence[Failure]
    ) -> None:
        for item in follow:
            check_schedule(item)
        check_failures(failures)
        if follow or acks or failures:
            count = len(follow) + len(acks) + len(failures)
            self._wake.send(await self._by_size(count, self.engine.finish, follow, acks, failures))

    async def release(self, elements: Sequence[Claimed]) -> None:
        if elements:
            self._wake.send(await self._by_size(len(elements), self.engine.release, elements))

    async def heartbeat(
        self, worker: WorkerInfo, elements: Sequence[Claimed], lease: Leases
    ) -> None:
        check_leases(lease, {e.queue for e in elements})
        await self._by_size(len(elements), self.engine.heartbeat, worker, elements, lease)

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

    async def crawl_delays(self, groups: Collection[str] | None = None) -> dict[str, float]:
        return await self._quick(self.engine.crawl_delays, groups)

    async def raise_crawl_delays(self, delays: Mapping[str, float]) -> None:
        checked = checked_crawl_delays(delays)
        self._wake.send(await self._quick(self.engine.raise_crawl_delays, checked))

    async def robots_answer(self, origin: str) -> tuple[bytes, float] | None:
        return await self._quick(self.engine.robots_answer, origin)

    async def keep_robots_answer(self, origin: str, answer: bytes, seconds: float) -> None:
        check_robots_answer(origin, answer, seconds)
        await self._quick(self.engine.keep_robots_answer, origin, answer, seconds)

    async def block_group(self, group: str, until: float | None, reason: str | None) -> None:
        check_block_until(until)
        self._wake.send(await self._quick(self.engine.block_group, group, until, reason))

    async def reserve_send(self, group: str, gap: float, earliest: float = 0.0) -> float:
        return (await self.reserve_send_slot(group, gap, earliest))[1]

    async def reserve_send_slot(
        self,
        group: str,
        gap: float,
        earliest: float = 0.0,
        *,
        replacing: float | None = None,
        max_wait: float | None = None,
    ) -> tuple[float, float, bool]:
        slot: tuple[float, float, bool] = await self._quick(
            self.engine.reserve_send, group, gap, earliest, replacing, max_wait
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
        """Every broken internal invariant, credentials masked (a problem names its key)."""
        return [redact(problem) for problem in await self._call(self.engine.check)]

    async def dead_letters(
        self, queue: str, *, limit: int = 100, offset: int = 0
    ) -> list[DeadLetter]:
        return await self._call(self.engine.dead_letters, queue, max(0, limit), offset)

    async def requeue_dead(self, queue: str, keys: Sequence[str] | None = None) -> int:
        return await self._woken(functools.partial(self.engine.take_dead, queue, keys, True))

    async def purge_dead(self, queue: str, keys: Sequence[str] | None = None) -> int:
        count, _ = await self._call(self.engine.take_dead, queue, keys, False)
        return count
