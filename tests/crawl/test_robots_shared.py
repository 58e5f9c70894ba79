"""robots.txt fetched once per origin for every worker of a crawl: the first worker to meet
an origin keeps what it made of its robots.txt in the backend (`keep_robots_answer`), and
the others, in other processes or on other machines, read it instead of fetching it again.

Each worker here is a fetcher, a politeness and a backend of its own on one queue, as two
processes have them; the backend's clock is a manual one, so answers expire when told."""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import zlib
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager

import pytest
from aiohttp import web

from crawlq.backends import Backend, open_backend
from crawlq.crawl.errors import FetchError, Reason
from crawlq.crawl.fetcher import Fetcher
from crawlq.crawl.politeness import Politeness
from crawlq.crawl.response import Response
from crawlq.crawl.robots import RECALL_MARGIN, STORE_PAUSE, RobotsCache, origin
from crawlq.crawl.settings import FetchSettings
from crawlq.crawl.testing import Site, SyntheticWeb, respond
from crawlq.errors import BackendUnavailable, ConfigError

from ..helpers import ManualClock
from .conftest import fetch_settings
from .test_review_robots import answer

RULES = "User-agent: *\nDisallow: /page/2\n"
TTL = 3600.0
RETRY = 30.0


class Worker:
    def __init__(self, backend: Backend, fetcher: Fetcher) -> None:
        self.backend = backend
        self.fetcher = fetcher
        self.politeness = Politeness(backend)

    async def fetch(self, url: str) -> Response:
        return await self.politeness.fetch(self.fetcher, url)


@asynccontextmanager
async def workers(
    net: SyntheticWeb, url: str, clock: ManualClock, count: int = 2
) -> AsyncIterator[list[Worker]]:
    async with AsyncExitStack() as stack:
        started = []
        for _ in range(count):
            backend = open_backend(url, clock=clock)
            await backend.open()
            stack.push_async_callback(backend.close)
            settings = fetch_settings(net, robots_ttl=TTL, robots_retry=RETRY)
            fetcher = await stack.enter_async_context(Fetcher(settings))
            started.append(Worker(backend, fetcher))
        yield started


def robots_requests(net: SyntheticWeb) -> int:
    return sum(1 for h in net.hits if h.path == "/robots.txt")


async def test_a_second_worker_obeys_the_robots_txt_the_first_one_fetched(
    url: str, clock: ManualClock
) -> None:
    async with (
        SyntheticWeb([Site(name="a.test", pages=4, robots=RULES)]) as net,
        workers(net, url, clock) as (first, second),
    ):
        assert (await first.fetch(net.url("a.test", "/page/0"))).status == 200
        assert robots_requests(net) == 1
        assert (await second.fetch(net.url("a.test", "/page/1"))).status == 200
        with pytest.raises(FetchError) as refused:
            await second.fetch(net.url("a.test", "/page/2"))
        assert refused.value.reason is Reason.ROBOTS_DISALLOWED
        assert second.fetcher.robots.disallows(net.url("a.test", "/page/2"))
        assert robots_requests(net) == 1

        clock.advance(TTL + 1)  # the answer is out of date: the next to ask fetches it
        third = Worker(second.backend, Fetcher(fetch_settings(net)))
        async with third.fetcher:
            assert (await third.fetch(net.url("a.test", "/page/3"))).status == 200
        assert robots_requests(net) == 2
    assert [h.path for h in net.hits_for("a.test", pages_only=True)] == [
        "/page/0",
        "/page/1",
        "/page/3",
    ]


async def test_an_unreachable_robots_txt_pauses_the_site_for_every_worker_until_asked_again(
    url: str, clock: ManualClock
) -> None:
    site = Site(name="a.test", pages=3, routes={"/robots.txt": respond(503, "busy")})
    async with (
        SyntheticWeb([site]) as net,
        workers(net, url, clock, count=3) as (first, second, third),
    ):
        with pytest.raises(FetchError) as unreachable:
            await first.fetch(net.url("a.test", "/page/0"))
        with pytest.raises(FetchError) as also:
            await second.fetch(net.url("a.test", "/page/1"))
        assert unreachable.value.reason is also.value.reason is Reason.ROBOTS_UNAVAILABLE
        assert also.value.detail == "robots.txt answered 503"
        assert also.value.until is not None and also.value.transient
        assert robots_requests(net) == 1

        clock.advance(RETRY + 1)
        with pytest.raises(FetchError):
            await third.fetch(net.url("a.test", "/page/1"))
        assert robots_requests(net) == 2
    assert net.hits_for("a.test", pages_only=True) == []


async def test_an_answer_this_crawlq_cannot_read_is_fetched_again_and_replaced(
    url: str, clock: ManualClock
) -> None:
    async with SyntheticWeb([Site(name="a.test", pages=3, robots=RULES)]) as net:
        key = origin(net.url("a.test"))
        async with workers(net, url, clock, count=1) as (worker,):
            for unreadable in (
                b"not zlib",
                zlib.compress(b"[1, 2]"),
                zlib.compress(b'{"x": 1}'),
                zlib.compress(b"[" * 100_000),  # deeper than json can read
            ):
                await worker.backend.keep_robots_answer(key, unreadable, 60.0)
                fresh = Worker(worker.backend, Fetcher(fetch_settings(net, robots_ttl=TTL)))
                async with fresh.fetcher:
                    assert (await fresh.fetch(net.url("a.test", "/page/1"))).status == 200
            kept = await worker.backend.robots_answer(key)
    assert robots_requests(net) == 4
    assert kept is not None and TTL - 5 < kept[1] <= TTL
    assert json.loads(zlib.decompress(kept[0])) == {"text": RULES}


@pytest.mark.parametrize(
    "reason", [Reason.PROXY, Reason.BLOCKED, Reason.LOGIN_FAILED, Reason.TLS, Reason.DNS]
)
async def test_a_robots_txt_this_worker_got_no_answer_for_is_kept_by_none(
    url: str, clock: ManualClock, reason: Reason
) -> None:
    """Its proxies, address rules, login, certificates or resolve map may be its own: another
    worker may well reach the site."""
    asked: list[str] = []

    async def fetch(robots_url: str) -> Response:
        asked.append(robots_url)
        raise FetchError(reason, robots_url, "not from here")

    backend = open_backend(url, clock=clock)
    await backend.open()
    try:
        cache = RobotsCache(fetch, "crawlq", ttl=TTL, retry=RETRY)
        cache.store = backend
        rules = await cache.rules("http://a.test/page/1")
        assert rules.unavailable is not None and rules.failure is reason
        assert await backend.robots_answer("http://a.test") is None
    finally:
        await backend.close()
    assert asked == ["http://a.test/robots.txt"]


async def test_a_robots_txt_cut_short_by_this_workers_size_cap_is_kept_by_none(
    url: str, clock: ManualClock
) -> None:
    """A worker reading only its first `max_bytes` could pass on a file without its last
    rules: the others would fetch what it disallows."""
    short, long = "User-agent: *\nDisallow: /page/2\n", "# " + "x" * 600 + "\n" + RULES
    sites = [Site(name="a.test", pages=3, robots=short), Site(name="b.test", pages=3, robots=long)]
    async with SyntheticWeb(sites) as net:
        settings = fetch_settings(net, max_bytes=500)
        async with Fetcher(settings) as fetcher, workers(net, url, clock, count=1) as (worker,):
            capped = Worker(worker.backend, fetcher)
            for name in ("a.test", "b.test"):
                assert (await capped.fetch(net.url(name, "/page/1"))).status == 200
            kept = [
                await worker.backend.robots_answer(origin(net.url(n))) for n in ("a.test", "b.test")
            ]
    assert kept[0] is not None and kept[1] is None


class Unreachable:
    """A store whose backend is gone."""

    def __init__(self) -> None:
        self.calls = 0

    async def robots_answer(self, origin: str) -> tuple[bytes, float] | None:
        self.calls += 1
        raise BackendUnavailable("lost the backend")

    async def keep_robots_answer(self, origin: str, answer: bytes, seconds: float) -> None:
        self.calls += 1
        raise BackendUnavailable("lost the backend")


async def test_a_store_that_fails_is_one_warning_and_robots_txt_is_fetched_without_it(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Each call to a backend that cannot be reached takes its reconnect patience: after
    one fails, the store is left alone for a while."""
    asked: list[str] = []

    async def fetch(robots_url: str) -> Response:
        asked.append(robots_url)
        return answer(RULES)

    cache = RobotsCache(fetch, "crawlq", ttl=TTL)
    cache.store = store = Unreachable()
    assert not await cache.recall("http://a.test/page/2")
    with pytest.raises(FetchError) as refused:
        await cache.check("http://a.test/page/2")
    assert refused.value.reason is Reason.ROBOTS_DISALLOWED
    await cache.check("http://a.test/page/1")
    await cache.check("http://b.test/page/1")
    assert asked == ["http://a.test/robots.txt", "http://b.test/robots.txt"]
    assert store.calls == 1
    warnings = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert [r.getMessage() for r in warnings] == [
        "could not read the robots.txt answer of http://a.test in the backend (lost the "
        f"backend): robots.txt is fetched without it for {STORE_PAUSE:g} s"
    ]


@pytest.mark.parametrize("status", [401, 403, 407])
async def test_a_robots_txt_refused_to_this_worker_is_kept_by_none(
    url: str, clock: ManualClock, status: int
) -> None:
    """A 403 may be a firewall's for this worker's address: another may read the rules."""
    site = Site(name="a.test", pages=3, routes={"/robots.txt": respond(status, "no")})
    async with SyntheticWeb([site]) as net, workers(net, url, clock) as (first, second):
        assert (await first.fetch(net.url("a.test", "/page/1"))).status == 200  # allowed
        assert await first.backend.robots_answer(origin(net.url("a.test"))) is None
        assert (await second.fetch(net.url("a.test", "/page/2"))).status == 200
    assert robots_requests(net) == 2


async def test_a_5xx_through_a_proxy_is_kept_by_none(url: str, clock: ManualClock) -> None:
    """It may be the proxy's own answer."""
    busy = dataclasses.replace(answer("busy"), status=503)

    async def fetch(robots_url: str) -> Response:
        return busy

    backend = open_backend(url, clock=clock)
    await backend.open()
    try:
        for proxied, kept in ((True, False), (False, True)):
            cache = RobotsCache(fetch, "crawlq", ttl=TTL, retry=RETRY, proxied=proxied)
            cache.store = backend
            assert (await cache.rules("http://a.test/page/1")).unavailable is not None
            assert (await backend.robots_answer("http://a.test") is not None) is kept
    finally:
        await backend.close()


async def test_a_robots_txt_kept_for_ever_is_kept_a_hundred_years(
    url: str, clock: ManualClock
) -> None:
    async with (
        SyntheticWeb([Site(name="a.test", pages=3, robots=RULES)]) as net,
        workers(net, url, clock, count=1) as (worker,),
    ):
        forever = Worker(worker.backend, Fetcher(fetch_settings(net, robots_ttl=math.inf)))
        async with forever.fetcher:
            assert (await forever.fetch(net.url("a.test", "/page/1"))).status == 200
        kept = await worker.backend.robots_answer(origin(net.url("a.test")))
    assert kept is not None and kept[1] > 99 * 365 * 24 * 3600


async def test_an_answer_about_to_expire_is_not_recalled(url: str, clock: ManualClock) -> None:
    """`check` must find recalled rules standing, or it would fetch robots.txt unpaced."""

    async def fetch(robots_url: str) -> Response:
        raise AssertionError("not fetched")

    backend = open_backend(url, clock=clock)
    await backend.open()
    try:
        cache = RobotsCache(fetch, "crawlq", ttl=TTL)
        cache.store = backend
        packed = zlib.compress(json.dumps({"text": RULES}).encode())
        await backend.keep_robots_answer("http://a.test", packed, RECALL_MARGIN / 2)
        assert not await cache.recall("http://a.test/page/1")
        await backend.keep_robots_answer("http://a.test", packed, 60.0)
        assert await cache.recall("http://a.test/page/1")
        assert cache.disallows("http://a.test/page/2")
    finally:
        await backend.close()


async def test_a_robots_txt_too_large_to_keep_is_fetched_by_each_worker(
    url: str, clock: ManualClock
) -> None:
    """Over MAX_ROBOTS_ANSWER bytes compressed: every worker then reads its own."""
    noise = "".join(f"Disallow: /{n * 7919 % 1_000_003:x}{n}\n" for n in range(20_000))

    async def robots(request: web.Request) -> web.StreamResponse:
        return web.Response(text=f"User-agent: *\n{noise}Disallow: /page/2\n")

    site = Site(name="a.test", pages=3, routes={"/robots.txt": robots})
    async with SyntheticWeb([site]) as net, workers(net, url, clock) as (first, second):
        await first.fetch(net.url("a.test", "/page/0"))
        await second.fetch(net.url("a.test", "/page/1"))
        assert await first.backend.robots_answer(origin(net.url("a.test"))) is None
        with pytest.raises(FetchError) as refused:
            await second.fetch(net.url("a.test", "/page/2"))
    assert refused.value.reason is Reason.ROBOTS_DISALLOWED
    assert robots_requests(net) == 2


@pytest.mark.parametrize("ttl", [0.0, -1.0, math.nan])
def test_robots_txt_kept_for_no_time_is_refused(ttl: float) -> None:
    with pytest.raises(ConfigError, match="robots_ttl must be positive"):
        FetchSettings(robots_ttl=ttl)
