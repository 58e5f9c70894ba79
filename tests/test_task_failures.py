"""What a task raises is the failure of its element alone, and sync tasks never wait for a
thread: a worker's own cancellations (a stop, a lost lease, a timeout) keep their meaning."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import crawlq
from crawlq import App, Context, Retry, SyncContext

FAST_RETRY = Retry(max_attempts=2, base=0.01, factor=1, jitter=0)
GUARD = 60.0  # seconds: only a failing test waits this long


class Custom(BaseException):
    """A BaseException of the task's own, neither Exception nor one of Python's."""


RAISED: list[tuple[Callable[[], BaseException], str]] = [
    (lambda: SystemExit(3), "SystemExit: 3"),
    (lambda: KeyboardInterrupt(), "KeyboardInterrupt"),
    (lambda: asyncio.CancelledError(), "CancelledError"),
    (lambda: GeneratorExit(), "GeneratorExit"),
    (lambda: Custom("out of band"), "Custom: out of band"),
]


@pytest.fixture
def app(tmp_path: Path) -> App:
    return App(f"sqlite:///{tmp_path / 'app.db'}")


async def run_burst(app: App, **options: Any) -> crawlq.worker.WorkerStats:
    worker = crawlq.Worker(app, burst=True, burst_horizon=5, **options)
    return await asyncio.wait_for(worker.run(), GUARD)


@pytest.mark.parametrize("sync", [False, True], ids=["async", "sync"])
@pytest.mark.parametrize(("raise_", "error"), RAISED, ids=[e for _, e in RAISED])
async def test_a_base_exception_raised_by_a_task_fails_its_element_and_the_worker_goes_on(
    app: App,
    raise_: Callable[[], BaseException],
    error: str,
    sync: bool,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """sys.exit() in a task's code once ended the worker, its other elements stranded until
    their leases ran out; a CancelledError or a BaseException of its own left the element
    running until then, and dead as "lease expired", its error lost."""
    attempts: list[int] = []
    done: list[int] = []

    def boom_sync(ctx: SyncContext, n: int) -> None:
        attempts.append(ctx.attempt)
        raise raise_()

    async def boom_async(ctx: Context, n: int) -> None:
        attempts.append(ctx.attempt)
        raise raise_()

    app.task(queue="boom", group=None, retry=FAST_RETRY)(boom_sync if sync else boom_async)

    @app.task(group=None)
    async def fine(ctx: Context, n: int) -> None:
        done.append(n)

    await app.aschedule("boom", 1)
    await app.aschedule_many(fine, [1, 2, 3])
    stats = await run_burst(app)
    backend = await app.backend()
    queues = {q.name: q for q in await backend.queue_stats(["boom", "fine"])}
    (letter,) = await backend.dead_letters("boom")
    await app.aclose()
    assert attempts == [1, 2]  # retried by its policy
    assert sorted(done) == [1, 2, 3]
    assert (stats.failed, stats.dead, stats.done, stats.lapsed) == (2, 1, 3, 0)
    assert (queues["boom"].total, queues["boom"].running, queues["boom"].dead) == (0, 0, 1)
    assert letter.error == error
    assert f"in boom_{'sync' if sync else 'async'}" in letter.traceback
    assert "raise raise_()" in letter.traceback
    assert "never retrieved" not in caplog.text  # no asyncio task of the worker ended by it


async def test_an_exception_whose_message_fails_is_still_recorded(app: App) -> None:
    class Garbled(Exception):
        def __str__(self) -> str:
            raise ValueError("no message")

    @app.task(group=None, max_attempts=1)
    async def garbled(ctx: Context, n: int) -> None:
        raise Garbled

    await app.aschedule(garbled, 1)
    stats = await run_burst(app)
    (letter,) = await (await app.backend()).dead_letters("garbled")
    await app.aclose()
    assert (stats.failed, stats.dead) == (1, 1)
    assert letter.error == "Garbled: <str() raised ValueError>"


@pytest.mark.parametrize("own", [False, True], ids=["cancelled", "raising-its-own"])
async def test_a_task_cancelled_by_a_stop_goes_back_to_the_queue_not_to_its_failures(
    app: App, own: bool
) -> None:
    """The worker's own cancellation, even if the task answers it with a CancelledError of
    its own, is no failure: the element goes back, its attempt not spent on an error."""
    started = asyncio.Event()

    @app.task(group=None, lease=600)
    async def hold(ctx: Context, n: int) -> None:
        started.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            if own:
                raise asyncio.CancelledError("cleaning up") from None
            raise

    await app.aschedule(hold, 1)
    worker = crawlq.Worker(app, grace=600)
    running = asyncio.create_task(worker.run())
    await asyncio.wait_for(started.wait(), GUARD)
    worker.stop()
    worker.stop()  # hurry: running tasks are cancelled at once
    stats = await asyncio.wait_for(running, GUARD)
    (queue,) = await (await app.backend()).queue_stats(["hold"])
    await app.aclose()
    assert (stats.released, stats.failed, stats.done) == (1, 0, 0)
    assert (queue.total, queue.running, queue.dead) == (1, 0, 0)


async def test_sync_tasks_each_get_a_thread_so_their_timeout_counts_from_their_start(
    app: App,
) -> None:
    """On the loop's default pool (min(32, CPUs + 4) threads) sync tasks beyond its size
    waited for a thread, their timeout running: 30 tasks of 1 s with timeout=3 on 2 CPUs
    ended with 16 "timed out". The worker's own pool has a thread for each of its slots."""
    slots = 40  # more than the default pool has on any machine
    together = threading.Barrier(slots, timeout=GUARD / 3)
    threads: set[str] = set()

    @app.task(group=None, timeout=GUARD, max_attempts=1)
    def meet(ctx: SyncContext, n: int) -> None:
        threads.add(threading.current_thread().name)
        together.wait()  # passes only once all of them run at the same time

    await app.aschedule_many(meet, list(range(slots)))
    stats = await run_burst(app, concurrency=slots)
    letters = await (await app.backend()).dead_letters("meet")
    await app.aclose()
    assert [letter.error for letter in letters] == []
    assert stats.done == slots
    assert len(threads) == slots
    assert all(name.startswith("crawlq-task") for name in threads)
