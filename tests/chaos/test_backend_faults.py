"""Backend faults: a SQLite writer SIGKILLed mid-transaction 100 times, a full disk under
the SQLite file, redis-server SIGKILLed and restarted mid-crawl (appendfsync always and
everysec). Full-size figures: `python -m benchmarks.chaos_bench`."""

from __future__ import annotations

import asyncio
import shutil
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from redis import Redis as SyncRedis

from crawlq import Context
from crawlq.app import App
from crawlq.backends import open_backend
from crawlq.backends.redis import RedisBackend
from crawlq.crawl.crawler import Crawl
from crawlq.crawl.fetcher import Fetcher
from crawlq.crawl.politeness import Politeness
from crawlq.crawl.testing import Site, SyntheticWeb
from crawlq.testing.chaos import ChaosPlan, SyntheticWebThread, chaos_sites, run_worker_chaos
from crawlq.testing.faults import (
    QUEUE,
    CrashReport,
    Probes,
    crash_redis,
    disk_schedules,
    fill_disk,
    finish_probes,
    kill_writers,
    small_disk,
)
from crawlq.testing.redis_server import RedisServer
from crawlq.types import ClaimResult
from crawlq.worker import Worker

from ..crawl.conftest import crawl_settings, fetch_settings


def test_a_sqlite_writer_killed_100_times_never_corrupts_or_loses(tmp_path: Path) -> None:
    """Each kill lands at a random point of a schedule/claim/ack/fail loop (most inside a
    call); after each: integrity_check, Backend.check(), every acknowledged schedule queued
    unless an acknowledged ack finished it, no acknowledged ack undone."""
    report = kill_writers(f"sqlite:///{tmp_path / 'queue.db'}", tmp_path, kills=100)
    assert report.kills == 100
    assert report.inside_calls >= 25, report  # the kills did land mid-call
    assert report.corrupt == []
    assert report.problems == []
    assert report.journal.lost_schedules == []
    assert report.journal.revived == []
    assert report.journal.scheduled > 1000 and report.journal.acked > 100


# -- a full disk ----------------------------------------------------------------------------


async def test_a_full_disk_gives_a_clear_error_and_no_corruption(tmp_path: Path) -> None:
    """A 2 MB tmpfs of our own (a machine where it cannot be mounted fails the test) holds
    the queue: schedules are refused with a crawlq error once it is full, `crawlq schedule`
    says so in one line, the file is sound and nothing is lost; freed space, work goes on."""
    with small_disk(tmp_path / "disk") as folder:
        report = await fill_disk(folder)
    assert report.added > 100
    assert len(report.errors) == 3  # batches of 100, then 10, then 1: all refused in the end
    assert all(e.startswith("BackendError: disk full: ") for e in report.errors), report.errors
    assert "free some space" in report.errors[-1]
    assert report.cli_code != 0
    assert report.cli_stderr.strip().count("\n") == 0, report.cli_stderr  # one line
    assert "disk full" in report.cli_stderr
    assert report.integrity == ["ok"]
    assert report.problems == []
    assert report.total == report.added  # nothing acknowledged was lost
    assert (report.added_after, report.claimed_after) == (20, 10)
    assert report.problems_after == []
    assert report.integrity_after == ["ok"]


# -- Redis crashes --------------------------------------------------------------------------


async def test_a_redis_call_waits_for_a_restarting_server() -> None:
    """A call that needs a new connection while redis-server is down waits for it to come
    back instead of failing at once (a refused connection is an OSError to redis-py)."""
    server = RedisServer(appendonly=True, appendfsync="always")
    url = server.start()
    backend = open_backend(url)
    try:
        await backend.open()
        await backend.ensure_queues([QUEUE])
        await backend.schedule(disk_schedules(backend, "before", 5))
        server.stop(kill=True)
        loop = asyncio.get_running_loop()
        restarted = loop.run_in_executor(None, server.start)
        claimed = await backend.claim([QUEUE.name], worker="w", limit=10, lease=60)
        await restarted
        assert len(claimed.elements) == 5
        assert backend.epoch == 1  # it saw a new run of the server
    finally:
        await backend.close()
        server.remove()


class FlakyFront:
    """A TCP front for redis-server that, when told, drops every connection it carries and
    then the next `drops` new ones right after accepting them: a server going down and coming
    back, as seen by a client reconnecting in between."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.drops = 0
        self.dropped = 0
        self._open: set[asyncio.StreamWriter] = set()
        self._server: asyncio.Server | None = None
        self.idle = asyncio.Event()  # no connection carried

    async def start(self) -> int:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        port: int = self._server.sockets[0].getsockname()[1]
        return port

    def crash(self, drops: int) -> None:
        self.drops = drops
        for writer in list(self._open):
            writer.transport.abort()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self.drops:
            self.drops -= 1
            self.dropped += 1
            writer.transport.abort()
            return
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.port)
        self._open.update((writer, up_writer))
        self.idle.clear()

        async def pipe(source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
            try:
                while data := await source.read(65536):
                    sink.write(data)
                    await sink.drain()
            except OSError:
                pass
            finally:
                sink.transport.abort()

        await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))
        self._open.difference_update((writer, up_writer))
        if not self._open:
            self.idle.set()

    async def close(self) -> None:
        self.crash(0)
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()


async def test_a_redis_call_outlasts_connections_dropped_in_their_handshake() -> None:
    """The pooled connection is found dead and the new ones die in their handshake: redis-py
    raises that at once (it retries only commands already on a connection); the backend
    tries again until the server is back."""
    server = RedisServer()
    server.start()
    front = FlakyFront(server.port)
    try:
        port = await front.start()
        backend = open_backend(f"redis://127.0.0.1:{port}/0")
        await backend.open()
        try:
            await backend.ensure_queues([QUEUE])
            front.crash(drops=3)
            await asyncio.wait_for(front.idle.wait(), 30)  # the client's sockets were reset
            await backend.schedule(disk_schedules(backend, "after", 5))
            assert front.dropped == 3
            assert (await backend.queue_stats([QUEUE.name]))[0].total == 5
            assert backend.epoch == 0  # the same run of the server all along: nothing lost
        finally:
            await backend.close()
    finally:
        await front.close()
        server.remove()


@pytest.mark.parametrize("max_pages", [None, 7], ids=["no-budget", "budget-spent"])
async def test_a_crawl_fetches_again_what_a_restarted_redis_lost(
    max_pages: int | None, tmp_path: Path
) -> None:
    """A crashed redis-server with `appendfsync everysec` may come back without its last
    confirmed writes. Here it loses all the crawl wrote (queue, limits, seed, links, acks)
    once the crawl is done. The crawl stores its queue, limits and seed again, and forgets
    the links it remembered queueing, so the seed and every page it leads to are fetched
    again. (A CI run lost two pages when that memory outlived the links.) A page budget the
    first crawl spent whole does not stop that: the budget (in the output folder, not in
    Redis) knows the URLs it charged for, and admits them again for free."""
    server = RedisServer(appendonly=True, appendfsync="always")
    url = server.start()
    try:
        await create_namespace(url)  # nothing of the crawl's is stored yet
        fresh = server.snapshot()
        async with SyntheticWeb([Site(name="a.test", pages=7)]) as net:
            crawl = Crawl(crawl_settings(net, tmp_path, max_pages=max_pages), backend=url)
            await crawl.seed([net.url("a.test")])
            first = await Worker(crawl.app, burst=True, concurrency=4).run()
            server.crash_back_to(fresh)
            second = await Worker(crawl.app, burst=True, concurrency=4).run()
            backend = await crawl.app.backend()
            epoch, (stats,) = backend.epoch, await backend.queue_stats()
            used = crawl.budget.used()
            await crawl.aclose()
    finally:
        server.remove()
    assert epoch == 1
    assert (first.done, second.done) == (7, 7)
    assert used == (7 if max_pages else 0)
    assert (stats.total, stats.dead) == (0, 0)
    hits = Counter(net.url(hit.host, hit.path) for hit in net.hits if hit.path != "/robots.txt")
    assert hits == dict.fromkeys(net.page_urls("a.test"), 2)


async def test_an_app_stores_its_queues_and_limits_again_in_a_redis_that_lost_them() -> None:
    """A restarted Redis that lost the app's queue and limit rules (stored when it first
    connected) gets them again: with the default limit in their place, a crawl would be
    polite by the wrong rule on every machine."""
    server = RedisServer(appendonly=True, appendfsync="always")
    url = server.start()
    app = App(url)
    app.limit("*.test", concurrency=1, interval=0.5)
    app.task(queue="pages")(noop)
    try:
        await create_namespace(url)  # nothing of the app's is stored yet
        fresh = server.snapshot()
        backend = await app.backend()
        server.crash_back_to(fresh)
        lost = await backend.limits()  # this call finds the server restarted
        assert backend.epoch == 1
        assert await app.backend() is backend
        rules, queues = await backend.limits(), await backend.queues()
    finally:
        await app.aclose()
        server.remove()
    assert "*.test" not in {rule.pattern for rule in lost}
    assert "*.test" in {rule.pattern for rule in rules}
    assert [queue.name for queue in queues] == ["pages"]


async def noop() -> None:
    return None


async def create_namespace(url: str) -> None:
    """The backend's own keys (version, default limit, functions) and nothing else."""
    backend = open_backend(url)
    await backend.open()
    await backend.close()


class CrashingAtFirstClaim(RedisBackend):
    """A real Redis backend whose first claim crashes the server back to `snapshot` just
    before it is sent: the claim itself is what finds the server restarted."""

    def __init__(self, url: str, server: RedisServer, snapshot: Path) -> None:
        super().__init__(url)
        self.server, self.snapshot = server, snapshot

    async def claim(self, queues: Sequence[str], **options: Any) -> ClaimResult:
        if self.snapshot.exists():
            self.server.crash_back_to(self.snapshot)
            shutil.rmtree(self.snapshot)
        return await super().claim(queues, **options)


async def test_a_claim_that_finds_redis_lost_the_limits_gives_its_elements_back(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The queue has three elements of one host; the app limits hosts to one request at a
    time, a rule the crash lost (the default allows 4). The claim that finds the restart
    took all three by the default rule: it gives them back, the rule is stored again, and
    they run one at a time."""
    server = RedisServer(appendonly=True, appendfsync="always")
    url = server.start()
    app = App(url)
    app.limit("*", concurrency=1)
    running: list[int] = []
    peak: list[int] = []

    @app.task(queue="pages")
    async def pages(ctx: Context, url: str) -> None:
        running.append(1)
        peak.append(len(running))
        await asyncio.sleep(0.05)
        running.pop()

    try:
        producer = App(url)
        producer.task(queue="pages")(noop)
        await producer.aschedule_many("pages", [f"http://h.test/{n}" for n in range(3)])
        await producer.aclose()
        queued = server.snapshot()  # the queue and its elements; no rule of the worker's app
        monkeypatch.setattr(
            "crawlq.app.open_backend", lambda url, **_: CrashingAtFirstClaim(url, server, queued)
        )
        stats = await Worker(app, burst=True, concurrency=10).run()
        backend = await app.backend()
        rules = {rule.pattern: rule.limit.concurrency for rule in await backend.limits()}
        epoch = backend.epoch
        await app.aclose()
    finally:
        server.remove()
    assert epoch == 1
    assert rules["*"] == 1
    assert stats.done == 3
    assert max(peak) == 1


async def test_a_worker_stores_its_crawl_delays_and_blocks_again_in_a_redis_that_lost_them(
    tmp_path: Path,
) -> None:
    """A Crawl-delay and a 429 pause a worker stored are lost in a crash: every other
    worker would pace a.test by the plain rule and send to b.test during its pause. The
    worker that heard them stores them again with its next request."""
    server = RedisServer(appendonly=True, appendfsync="always")
    url = server.start()
    backend = open_backend(url)
    try:
        await backend.open()
        fresh = server.snapshot()
        politeness = Politeness(backend)
        await politeness.crawl_delay("a.test", 2.0)
        until = backend.now() + 600
        await politeness.block("b.test", until, "429 Retry-After 600")
        server.crash_back_to(fresh)
        lost = await backend.crawl_delays()
        web = SyntheticWeb([Site(name="c.test", pages=1)])
        async with web as net, Fetcher(fetch_settings(net)) as fetcher:
            await politeness.fetch(fetcher, net.url("c.test", "/page/0"))
        crawl_delays = await backend.crawl_delays()
        (blocked,) = await backend.group_stats("b.test", include_idle=True)
    finally:
        await backend.close()
        server.remove()
    assert lost == {}
    assert crawl_delays == {"a.test": 2.0}
    assert blocked.blocked_until == pytest.approx(until, abs=0.01)
    assert blocked.block_reason == "429 Retry-After 600"


async def test_a_redis_user_without_info_works_and_is_warned_of_unnoticed_restarts(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Restarts are noticed by INFO's run_id; an ACL that leaves INFO out (it is in
    @dangerous) must not lock crawlq out: the backend works, and says what it cannot see."""
    server = RedisServer()
    server.start()
    admin = SyncRedis(port=server.port)
    admin.acl_setuser("crawler", enabled=True, passwords=["+secret"], keys=["*"], channels=["*"],
                      commands=["+@all", "-info"])  # fmt: skip
    admin.close()
    backend = open_backend(f"redis://crawler:secret@127.0.0.1:{server.port}/0")
    try:
        await backend.open()
        await backend.ensure_queues([QUEUE])
        result = await backend.schedule(disk_schedules(backend, "acl", 3))
        claimed = await backend.claim([QUEUE.name], worker="w", limit=5, lease=60)
    finally:
        await backend.close()
        server.remove()
    assert result.added == 3 and len(claimed.elements) == 3
    assert backend.epoch == 0
    assert caplog.text.count("Redis gives no run_id") == 1
    assert "no permissions to run the 'info' command" in caplog.text
    assert "secret" not in caplog.text


@pytest.mark.timeout(300)  # its own limits (120 s) must fail first, with a diagnosis
@pytest.mark.parametrize("appendfsync", ["always", "everysec"])
def test_a_crawl_rides_out_redis_crashes(appendfsync: str, tmp_path: Path) -> None:
    """1,000 pages, 3 crawl processes and 2 probe writers on one redis-server with an
    append-only file; redis-server is SIGKILLed and restarted twice mid-crawl. The crawl
    finishes with every page, politely, and a consistent queue; with `always` nothing
    acknowledged is lost. (`everysec` loses nothing to a SIGKILL as a rule, as Redis wrote
    to the kernel before replying, but it may hold writes back while a slow fsync runs:
    its losses are measured by the benchmark, not asserted.)"""
    server = RedisServer(appendonly=True, appendfsync=appendfsync)
    url = server.start()
    report = CrashReport()
    probes = Probes(f"{url}?namespace=probes", tmp_path)
    try:
        plan = ChaosPlan(kills=0, stops=0, concurrency=1, lease=5.0, timeout=120)
        with SyntheticWebThread(chaos_sites(20, 50, latency=0.05)) as web:

            def crash() -> None:
                crash_redis(server, probes, report)

            result = run_worker_chaos(web, plan, url, tmp_path, faults=[(150, crash), (400, crash)])
        finish_probes(probes, report)
    finally:
        probes.close()
        server.remove()
    assert report.crashes == 2
    assert result.verdict.missing == []
    assert [v for v in result.verdict.violations if v.kind == "concurrency"] == []
    assert result.problems == []
    assert result.process_failures == []
    assert report.scheduled > 1000
    if appendfsync == "always":
        assert report.lost_schedules == set()
        assert report.revived == set()
        assert result.verdict.duplicates == 0  # no ack of a fetched page was lost
