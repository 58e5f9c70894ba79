"""The SQLite backend applies the schedules waiting for its thread in one transaction (a page's
links are one batch, and a crawl schedules hundreds of them a second); each call still gets
what it alone would have done, and a batch that fails fails alone."""

from __future__ import annotations

import asyncio
import fcntl
import os
import sqlite3
import threading
from collections.abc import AsyncIterator, Awaitable, Sequence
from dataclasses import replace
from pathlib import Path

import pytest

from crawlq.backends.sqlite.backend import SQLiteBackend
from crawlq.errors import BackendError, UnknownQueue
from crawlq.tasks import prepare
from crawlq.types import Limit, LimitRule, Mode, QueueConfig, Schedule, ScheduleResult
from crawlq.writelock import TurnTaken

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
    """Keeps the backend's thread busy, holding the connection, until released: schedules,
    which cannot run on the event loop meanwhile, pile up for the thread."""

    def __init__(self, backend: SQLiteBackend) -> None:
        self.started = threading.Event()
        self.release = threading.Event()
        assert backend._thread is not None
        self.backend = backend
        self.done = backend._thread.submit(self._hold)

    def _hold(self) -> None:
        with self.backend._busy:
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


async def test_a_loop_turn_of_schedules_is_one_transaction_on_the_event_loop(
    backend: SQLiteBackend, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With the connection free and no other process writing, a page's links do not wait for
    the thread: the batches handed over in one turn of the loop go in one transaction, there."""
    engine = backend.engine
    applied: list[tuple[str, int]] = []
    schedule_batches = engine.schedule_batches

    def recorded(batches: Sequence[Sequence[Schedule]]) -> tuple[list[ScheduleResult], list[str]]:
        applied.append((threading.current_thread().name, len(batches)))
        return schedule_batches(batches)

    monkeypatch.setattr(engine, "schedule_batches", recorded)
    first, second, third = await asyncio.wait_for(
        asyncio.gather(
            links(backend, url("a.test", 1), url("a.test", 2)),
            links(backend, url("a.test", 2), url("b.test", 1)),
            links(backend, url("c.test", 1)),
        ),
        DEADLINE,
    )
    assert applied == [(threading.current_thread().name, 3)]
    assert [(r.added, r.kept) for r in (first, second, third)] == [(2, 0), (1, 1), (1, 0)]


async def test_a_call_that_would_wait_for_another_process_goes_to_the_thread(
    backend: SQLiteBackend,
) -> None:
    """Another process holds the write turn: claims and schedules wait for it on the backend's
    thread, and the event loop goes on meanwhile, reading through the connection: the thread
    does not hold it while it waits for the turn."""
    await links(backend, url("a.test", 1))
    other = os.open(backend.path + "-writer", os.O_RDONLY)  # a file of its own, as a process has
    try:
        fcntl.flock(other, fcntl.LOCK_EX)
        claim = asyncio.ensure_future(backend.claim(["crawl"], worker="w", limit=10, lease=60))
        schedule = asyncio.ensure_future(links(backend, url("b.test", 1)))
        turns = 0
        while turns < 20:  # the loop turns while both wait for the other process
            await asyncio.sleep(0.01)
            turns += 1
        assert not claim.done() and not schedule.done()
        assert not backend._busy.locked()
        assert await asyncio.wait_for(backend.robots_answer("http://a.test"), DEADLINE) is None
        fcntl.flock(other, fcntl.LOCK_UN)
        claimed = await asyncio.wait_for(claim, DEADLINE)
        assert (await asyncio.wait_for(schedule, DEADLINE)).added == 1
    finally:
        os.close(other)
    assert [c.group for c in claimed.elements] == ["a.test"]


async def test_the_rest_of_a_long_log_is_copied_on_the_thread(
    backend: SQLiteBackend, monkeypatch: pytest.MonkeyPatch
) -> None:
    """When the checkpointer hands the rest of a long log over, the copy (a sync of the file)
    is not made on the event loop but on the thread, once."""
    store = backend.engine.store
    copied: list[str] = []
    restart_log = store._restart_log

    def recorded() -> None:
        copied.append(threading.current_thread().name)
        restart_log()

    monkeypatch.setattr(store, "_restart_log", recorded)
    monkeypatch.setattr(store._checkpointer, "_restart_due", True)
    await links(backend, url("a.test", 1))
    await links(backend, url("a.test", 2))
    await backend._call(lambda: None)  # after the thread's work handed over before it
    assert len(copied) == 1
    assert copied[0] != threading.current_thread().name
    assert not store.log_handed_over


async def test_a_loop_turn_takes_at_most_a_thousand_elements_in_one_transaction(
    backend: SQLiteBackend, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What the loop runs at once stays small: batches beyond AT_ONCE_ITEMS elements start a
    transaction (and a loop callback) of their own."""
    engine = backend.engine
    sizes: list[list[int]] = []
    schedule_batches = engine.schedule_batches

    def recorded(batches: Sequence[Sequence[Schedule]]) -> tuple[list[ScheduleResult], list[str]]:
        sizes.append([len(batch) for batch in batches])
        return schedule_batches(batches)

    monkeypatch.setattr(engine, "schedule_batches", recorded)
    hosts = ("a.test", "b.test", "c.test")
    results = await asyncio.wait_for(
        asyncio.gather(*(links(backend, *(url(h, n) for n in range(600))) for h in hosts)),
        DEADLINE,
    )
    assert sizes == [[600], [600], [600]]
    assert [r.added for r in results] == [600, 600, 600]


async def test_a_batch_that_found_the_turn_taken_alone_is_tried_again(
    backend: SQLiteBackend, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A failing batch has the others of its turn applied one by one; one that meets another
    process's turn then is not applied, and its caller tries again (it never hears TurnTaken),
    while the failing one fails alone."""
    engine = backend.engine
    schedule = engine.schedule
    refused: list[str] = []

    def turn_taken_once(items: Sequence[Schedule]) -> tuple[ScheduleResult, list[str]]:
        if not refused and items[0].queue == "crawl":
            refused.append(items[0].key)
            raise TurnTaken(backend.path)
        return schedule(items)

    monkeypatch.setattr(engine, "schedule", turn_taken_once)
    good = asyncio.ensure_future(links(backend, url("a.test", 1)))
    bad = asyncio.ensure_future(links(backend, url("b.test", 1), queue="missing"))
    assert (await asyncio.wait_for(good, DEADLINE)).added == 1
    with pytest.raises(UnknownQueue):
        await asyncio.wait_for(bad, DEADLINE)
    assert len(refused) == 1


async def test_another_programs_write_lock_is_waited_for_on_the_thread(
    backend: SQLiteBackend,
) -> None:
    """A program that writes the file without crawlq's write turn (a sqlite3 shell, a backup)
    holds SQLite's own lock: the loop does not wait for it in SQLite's busy handler (the
    thread does)."""
    await links(backend, url("a.test", 1))
    other = sqlite3.connect(backend.path, isolation_level=None, timeout=DEADLINE)
    try:
        other.execute("BEGIN IMMEDIATE")
        claim = asyncio.ensure_future(backend.claim(["crawl"], worker="w", limit=10, lease=60))
        turns = 0
        while turns < 20:  # the loop turns while the claim waits
            await asyncio.sleep(0.01)
            turns += 1
        assert not claim.done()
        other.execute("COMMIT")
        claimed = await asyncio.wait_for(claim, DEADLINE)
    finally:
        other.close()
    assert [c.group for c in claimed.elements] == ["a.test"]


async def test_a_schedule_trying_again_when_its_backend_closes_says_so(
    tmp_path: Path,
) -> None:
    opened = SQLiteBackend(f"sqlite:///{tmp_path / 'queue.db'}", clock=ManualClock())
    await opened.open()
    await opened.ensure_queues([CRAWL])
    other = os.open(opened.path + "-writer", os.O_RDONLY)
    try:
        fcntl.flock(other, fcntl.LOCK_EX)
        pending = asyncio.ensure_future(links(opened, url("a.test", 1)))
        await asyncio.sleep(0)  # its batch meets the taken turn, and it pauses to try again
        await opened.close()
        with pytest.raises(BackendError, match="not open"):
            await asyncio.wait_for(pending, DEADLINE)
    finally:
        os.close(other)
