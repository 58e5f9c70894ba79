"""A page is acknowledged only once its outputs are on disk: before a worker records a batch
of finished elements, the app's shared resources sync (fsync) what they wrote: the WARC
records, their index, the page records. If that fails, the batch's elements fail and run
again rather than being done without their outputs."""

from __future__ import annotations

import asyncio
import errno
import json
import os
from dataclasses import dataclass
from pathlib import Path

import pytest

from crawlq import App, Retry
from crawlq.context import Context
from crawlq.crawl.crawler import PAGES_FILE, WARC_DIR, Crawl
from crawlq.crawl.store import WarcStore
from crawlq.crawl.testing import Site, SyntheticWeb
from crawlq.crawl.warc import RotatingWarcWriter, read_record
from crawlq.types import Claimed, Failure, Schedule
from crawlq.worker import Worker

from .conftest import crawl_settings
from .test_warc_faults import page


@dataclass(frozen=True)
class Synced:
    path: Path
    size: int  # the file's size when it was synced


class Syncs:
    """Every fsync of the test, with what it covered; `failing` makes the next ones fail."""

    def __init__(self) -> None:
        self.done: list[Synced] = []
        self.failing = 0
        self._fsync = os.fsync

    def __call__(self, fd: int) -> None:
        if self.failing:
            self.failing -= 1
            raise OSError(errno.EIO, "Input/output error")
        self._fsync(fd)
        self.done.append(Synced(Path(os.readlink(f"/proc/self/fd/{fd}")), os.fstat(fd).st_size))

    def covered(self, path: Path, end: int) -> bool:
        return covered(self.done, path, end)


def covered(done: list[Synced], path: Path, end: int) -> bool:
    """Whether one of the syncs `done` covered the first `end` bytes of `path`."""
    return any(s.path == path.resolve() and s.size >= end for s in done)


@pytest.fixture
def syncs(monkeypatch: pytest.MonkeyPatch) -> Syncs:
    syncs = Syncs()
    monkeypatch.setattr(os, "fsync", syncs)
    return syncs


async def test_stored_responses_are_on_disk_and_indexed_once_the_store_syncs(
    tmp_path: Path, syncs: Syncs
) -> None:
    store = WarcStore(tmp_path)
    try:
        refs = [await store.put(page(n)) for n in range(3)]
        assert not store.refs(page(0).url)  # written, not yet indexed...
        assert (await store.get(page(1).url)) is not None  # ...and found all the same
        await store.sync()
        assert [store.refs(page(n).url) for n in range(3)] == [[ref] for ref in refs]
    finally:
        await store.aclose()

    for ref in refs:
        assert syncs.covered(tmp_path / ref.file, ref.offset + ref.length)
    assert syncs.covered(tmp_path, 0)  # the new file's name: its directory, synced once
    assert [read_record(tmp_path, ref).url for ref in refs] == [page(n).url for n in range(3)]


async def test_a_failed_sync_raises_and_the_next_record_starts_a_new_file(
    tmp_path: Path, syncs: Syncs
) -> None:
    store = WarcStore(tmp_path)
    try:
        first = await store.put(page(1))
        await store.sync()
        second = await store.put(page(2))
        syncs.failing = 1
        with pytest.raises(OSError, match="Input/output error"):
            await store.sync()
        third = await store.put(page(3))
        await store.sync()
    finally:
        await store.aclose()

    # Linux may have dropped the pages of a file whose sync failed: it is not written again,
    # and what the failed sync was to cover is left out of the index (its pages run again).
    assert third.file != first.file == second.file
    assert store.refs(page(2).url) == []
    assert store.refs(page(3).url) == [third]
    assert syncs.covered(tmp_path / third.file, third.offset + third.length)


def test_a_failed_sync_of_a_rotated_file_is_raised_by_the_next_sync(
    tmp_path: Path, syncs: Syncs
) -> None:
    writer = RotatingWarcWriter(tmp_path, max_file_bytes=1 << 20)
    writer.write(page(1))
    writer.sync()
    writer.write(page(2))
    syncs.failing = 1
    with pytest.raises(OSError, match="Input/output error"):
        writer.close()  # as a rotation does, in the middle of a batch
    writer.write(page(3))
    with pytest.raises(OSError, match="Input/output error"):
        writer.sync()  # page 2 may not be on disk: its batch fails
    writer.write(page(4))
    writer.sync()
    writer.close()


async def test_a_crawl_acknowledges_a_page_only_once_its_record_and_response_are_on_disk(
    tmp_path: Path, syncs: Syncs, monkeypatch: pytest.MonkeyPatch
) -> None:
    acked: list[tuple[list[str], list[Synced]]] = []  # each batch, and the syncs done before
    async with SyntheticWeb([Site(name="a.test", pages=30)]) as net:
        crawl = Crawl(crawl_settings(net, tmp_path))
        backend = await crawl.app.backend()
        finish = backend.finish

        async def finish_seen(
            follow: list[Schedule], acks: list[Claimed], failures: list[Failure]
        ) -> None:
            acked.append(([json.loads(c.payload)["url"] for c in acks], list(syncs.done)))
            await finish(follow, acks, failures)

        monkeypatch.setattr(backend, "finish", finish_seen)
        await crawl.run([net.url("a.test")], concurrency=10)

    pages = tmp_path / PAGES_FILE
    line_ends, end = {}, 0
    for line in pages.read_bytes().splitlines(keepends=True):
        end += len(line)
        line_ends[json.loads(line)["url"]] = end
    store = WarcStore(tmp_path / WARC_DIR)
    assert sorted(url for urls, _ in acked for url in urls) == sorted(net.page_urls("a.test"))
    for urls, done in acked:
        for url in urls:
            [ref] = store.refs(url)
            assert covered(done, pages, line_ends[url])
            assert covered(done, tmp_path / WARC_DIR / ref.file, ref.offset + ref.length)


class Outputs:
    """A shared resource whose syncs fail while `failing` says so (one list for every
    worker's instance)."""

    def __init__(self, failing: list[int]) -> None:
        self.failing = failing

    async def sync(self) -> None:
        if self.failing[0]:
            self.failing[0] -= 1
            raise OSError(errno.EIO, "Input/output error")


async def test_a_failed_sync_stops_the_worker_and_its_elements_run_again(
    tmp_path: Path,
) -> None:
    app = App(f"sqlite:///{tmp_path / 'queue.db'}")
    failing = [1]
    app.provide("outputs", lambda: Outputs(failing))
    runs: list[tuple[int, int]] = []

    @app.task(group=None, retry=Retry(max_attempts=3, base=0.01, jitter=0))
    async def work(ctx: Context, n: int) -> None:
        ctx.app.shared("outputs")
        runs.append((n, ctx.attempt))
        await ctx.schedule_with_ack(follow_up, [n])

    @app.task(group=None)
    async def follow_up(ctx: Context, n: int) -> None:
        runs.append((-n, ctx.attempt))

    await app.aschedule(work, 1)
    first = await Worker(app, burst=True, concurrency=1).run()
    # Its output may be lost: not done, and what would have come with its ack did not.
    assert runs == [(1, 1)]
    assert (first.done, first.failed) == (0, 1)
    second = await Worker(app, burst=True, concurrency=1).run()
    await app.aclose()

    assert runs == [(1, 1), (1, 2), (-1, 1)]
    assert (second.done, second.failed) == (2, 0)


class HeldOutputs:
    """Outputs whose sync waits until `released` (a lock another process holds)."""

    def __init__(self, syncing: asyncio.Event, released: asyncio.Event) -> None:
        self.syncing, self.released = syncing, released

    async def sync(self) -> None:
        self.syncing.set()
        await self.released.wait()


async def test_a_batch_waiting_for_its_outputs_sync_keeps_its_leases(tmp_path: Path) -> None:
    """A sync can wait for as long as another process holds a lock (the WARC index's, by a
    stopped process): meanwhile the heartbeats renew the batch's leases, or the element would
    be given to another worker and run twice."""
    app = App(f"sqlite:///{tmp_path / 'queue.db'}")
    syncing, released = asyncio.Event(), asyncio.Event()
    app.provide("outputs", lambda: HeldOutputs(syncing, released))
    runs: list[int] = []

    @app.task(group=None, lease=0.3)
    async def work(ctx: Context, n: int) -> None:
        ctx.app.shared("outputs")
        runs.append(n)

    await app.aschedule(work, 1)
    worker = Worker(app, burst=True, concurrency=1)
    running = asyncio.create_task(worker.run())
    await syncing.wait()
    backend = await app.backend()
    (claimed,) = await backend.worker_elements(worker.id)
    async with asyncio.timeout(10):  # some 30 heartbeats
        while True:  # until a heartbeat renews the waiting batch's lease
            (info,) = await backend.worker_elements(worker.id)
            if info.lease_until != claimed.lease_until:
                break
            await asyncio.sleep(0.02)
    released.set()
    stats = await running
    await app.aclose()
    assert runs == [1]
    assert (stats.done, stats.lapsed) == (1, 0)
