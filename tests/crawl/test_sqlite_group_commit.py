"""The SQLite backend applies the schedules waiting for its thread in one transaction (a page's
links are one batch, and a crawl schedules hundreds of them a second); each call still gets
what it alone would have done, and a batch that fails fails alone."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Awaitable
from dataclasses import replace
from pathlib import Path

import pytest

from crawlq.backends.sqlite.backend import SQLiteBackend
from crawlq.errors import UnknownQueue
from crawlq.tasks import prepare
from crawlq.types import Limit, LimitRule, Mode, QueueConfig, ScheduleResult

from ..helpers import ManualClock, url

CRAWL = QueueConfig(name="crawl", seen=True)
DEADLINE = 30.0


@pytest.fixture
async def backend(tmp_path: Path) -> AsyncIterator[SQLiteBackend]:
    opened = SQLiteBackend(f"sqlite:///{tmp_path / 'queue.db'}", clock=ManualClock())
    await opened.open()
    await opened.ensure_queues([CRAWL])
    await opened.set_limits([LimitRule(pattern="*", limit=Limit())])
    try:
        yield opened
        assert await opened.check() == []
    finally:
        await opened.close()


def links(backend: SQLiteBackend, *urls: str, queue: str = "crawl") -> Awaitable[ScheduleResult]:
    items = [
        replace(prepare(CRAWL, {"url": u}, due=backend.now(), mode=Mode.ONLY_IF_NEW), queue=queue)
        for u in urls
    ]
    return backend.schedule(items)


class HeldThread:
    """Keeps the backend's thread busy until released, so that schedules pile up."""

    def __init__(self, backend: SQLiteBackend) -> None:
        self.started = threading.Event()
        self.release = threading.Event()
        assert backend._thread is not None
        self.done = backend._thread.submit(self._hold)

    def _hold(self) -> None:
        self.started.set()
        self.release.wait(DEADLINE)

    def __enter__(self) -> HeldThread:
        assert self.started.wait(DEADLINE)
        return self

    def __exit__(self, *exc: object) -> None:
        self.release.set()


async def test_waiting_schedules_each_get_their_own_result(backend: SQLiteBackend) -> None:
    with HeldThread(backend):
        calls = [
            asyncio.ensure_future(links(backend, url("a.test", 1), url("a.test", 2))),
            asyncio.ensure_future(links(backend, url("a.test", 2), url("b.test", 1))),
            asyncio.ensure_future(links(backend, url("a.test", 1))),
        ]
        await asyncio.sleep(0)  # each call hands its batch over before the thread is free
    first, second, third = await asyncio.wait_for(asyncio.gather(*calls), DEADLINE)
    assert (first.added, first.kept) == (2, 0)
    assert (second.added, second.kept) == (1, 1)
    assert (third.added, third.kept) == (0, 1)
    result = await backend.claim(["crawl"], worker="w", limit=10, lease=60)
    assert sorted(c.group for c in result.elements) == ["a.test", "a.test", "b.test"]


async def test_a_failing_batch_fails_alone(backend: SQLiteBackend) -> None:
    with HeldThread(backend):
        # The first batch makes a new group, undone with the shared transaction.
        good = asyncio.ensure_future(links(backend, url("new.test", 1)))
        bad = asyncio.ensure_future(links(backend, url("c.test", 1), queue="missing"))
        later = asyncio.ensure_future(links(backend, url("new.test", 2)))
        await asyncio.sleep(0)
    assert (await asyncio.wait_for(good, DEADLINE)).added == 1
    with pytest.raises(UnknownQueue):
        await asyncio.wait_for(bad, DEADLINE)
    assert (await asyncio.wait_for(later, DEADLINE)).added == 1
    result = await backend.claim(["crawl"], worker="w", limit=10, lease=60)
    assert [c.group for c in result.elements] == ["new.test", "new.test"]


async def test_a_schedule_cancelled_before_its_turn_is_not_applied(
    backend: SQLiteBackend,
) -> None:
    with HeldThread(backend):
        cancelled = asyncio.ensure_future(links(backend, url("a.test", 1)))
        kept = asyncio.ensure_future(links(backend, url("a.test", 2)))
        await asyncio.sleep(0)
        cancelled.cancel()
    assert (await asyncio.wait_for(kept, DEADLINE)).added == 1
    assert cancelled.cancelled()
    (stats,) = await backend.queue_stats(["crawl"])
    assert stats.total == 1


async def test_schedules_from_two_event_loops_are_each_answered_on_their_own(
    backend: SQLiteBackend,
) -> None:
    """A caller on another thread's loop (a sync caller's portal, say) can share a commit with
    ours; its answer comes on its own loop, which would otherwise never wake for it."""
    answered: list[ScheduleResult] = []

    def from_another_loop() -> None:
        answered.append(asyncio.run(asyncio.wait_for(links(backend, url("b.test", 1)), DEADLINE)))

    thread = threading.Thread(target=from_another_loop)
    commit = backend._thread
    assert commit is not None
    with HeldThread(backend):
        ours = asyncio.ensure_future(links(backend, url("a.test", 1)))
        thread.start()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + DEADLINE
        while commit.waiting < 2 and loop.time() < deadline:
            await asyncio.sleep(0.01)  # until the other loop's batch waits beside ours
        assert commit.waiting == 2
    assert (await asyncio.wait_for(ours, DEADLINE)).added == 1
    await asyncio.to_thread(thread.join, DEADLINE)
    assert [result.added for result in answered] == [1]
