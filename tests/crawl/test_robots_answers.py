"""What a site's robots.txt answer means for its pages, as RFC 9309 says: unreachable (5xx,
no connection) pauses the site until robots.txt is asked again, and each retry of a page
meets a fresh answer; redirect loops allow everything; a huge one is parsed as far as
MAX_ROBOTS_BYTES."""

from __future__ import annotations

import asyncio
import itertools
from pathlib import Path

import pytest
from aiohttp import web

from crawlq.crawl import robots as robots_module
from crawlq.crawl.crawler import Crawl
from crawlq.crawl.errors import FetchError, Reason
from crawlq.crawl.fetcher import Fetcher
from crawlq.crawl.robots import MAX_ROBOTS_BYTES
from crawlq.crawl.testing import Site, SyntheticWeb, redirect, respond

from .conftest import FAST_RETRY, crawl_settings, fetch_settings
from .test_crawl import records_by_url

RETRY = 0.5  # robots_retry: how long an unreachable robots.txt stands


def robots_hits(net: SyntheticWeb) -> list[float]:
    return [h.at for h in net.hits_for("a.test") if h.path == "/robots.txt"]


async def test_a_page_waits_out_a_robots_txt_that_failed_once_and_is_fetched_after_it(
    tmp_path: Path,
) -> None:
    """Its retries (0.05 s apart) used to fail from the cached 503 without a request, for
    the whole minute it stood: three attempts, a dead letter, the host never asked again."""
    answers: list[int] = []

    async def robots(request: web.Request) -> web.StreamResponse:
        answers.append(503 if not answers else 200)
        return web.Response(status=answers[-1], text="User-agent: *\nDisallow: /page/2\n")

    site = Site(name="a.test", pages=3, routes={"/robots.txt": robots})
    async with SyntheticWeb([site]) as net:
        fetch = fetch_settings(net, robots_retry=RETRY)
        crawl = Crawl(crawl_settings(net, tmp_path, fetch=fetch))
        stats = await crawl.run([net.url("a.test")])
    first, second = robots_hits(net)
    assert answers == [503, 200] and second >= first + RETRY
    assert [h.path for h in net.hits_for("a.test", pages_only=True)] == ["/page/0", "/page/1"]
    assert all(h.at >= second for h in net.hits_for("a.test", pages_only=True))
    seed = records_by_url(tmp_path)[net.url("a.test")]
    assert [(r["error"], r["retry"], r["status"]) for r in seed] == [
        ("robots_unavailable", True, None),
        (None, False, 200),
    ]
    assert stats.dead == 0


async def test_a_page_of_a_site_whose_robots_txt_never_answers_dies_one_attempt_per_answer(
    tmp_path: Path,
) -> None:
    site = Site(name="a.test", pages=3, routes={"/robots.txt": respond(503, "busy")})
    async with SyntheticWeb([site]) as net:
        fetch = fetch_settings(net, robots_retry=RETRY)
        crawl = Crawl(crawl_settings(net, tmp_path, fetch=fetch))
        stats = await crawl.run([net.url("a.test")])
        backend = await crawl.app.backend()
        (dead,) = await backend.dead_letters("crawl")
        await crawl.app.aclose()
    asked = robots_hits(net)
    assert len(asked) == FAST_RETRY.max_attempts == 3
    assert all(later - earlier >= RETRY for earlier, later in itertools.pairwise(asked))
    assert net.hits_for("a.test", pages_only=True) == []
    assert stats.dead == 1 and "robots.txt answered 503" in dead.error


async def test_a_robots_txt_behind_a_redirect_loop_allows_everything(tmp_path: Path) -> None:
    site = Site(name="a.test", pages=3, routes={"/robots.txt": redirect("/robots.txt")})
    async with SyntheticWeb([site]) as net:
        crawl = Crawl(crawl_settings(net, tmp_path))
        stats = await crawl.run([net.url("a.test")])
    assert sorted(h.path for h in net.hits_for("a.test", pages_only=True)) == [
        "/page/0",
        "/page/1",
        "/page/2",
    ]
    assert stats.dead == 0 and len(robots_hits(net)) == 1


async def test_a_robots_txt_over_the_size_cap_is_obeyed_as_far_as_it_was_read(
    tmp_path: Path,
) -> None:
    """It used to fail TOO_LARGE, which allowed everything."""
    text = "User-agent: *\nDisallow: /page/1\n" + "# padding\n" * (MAX_ROBOTS_BYTES // 5)
    site = Site(name="a.test", pages=3, robots=text)
    async with SyntheticWeb([site]) as net:
        fetch = fetch_settings(net, max_bytes=MAX_ROBOTS_BYTES)
        crawl = Crawl(crawl_settings(net, tmp_path, fetch=fetch))
        await crawl.run([net.url("a.test")])
    assert len(text) > 2 * MAX_ROBOTS_BYTES
    assert [h.path for h in net.hits_for("a.test", pages_only=True)] == ["/page/0", "/page/2"]
    record = records_by_url(tmp_path)[net.url("a.test", "/page/1")]
    assert [r["error"] for r in record] == ["robots_disallowed"]


async def test_the_rules_kept_are_bounded_in_bytes_the_least_recently_used_going_first(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Parsed rules take about 6 bytes a byte of robots.txt: 10,000 origins of 512 KiB
    each would be 30 GB."""
    robots = "User-agent: *\n" + "".join(f"Disallow: /no/{n}\n" for n in range(500))
    size = robots_module.RULES_OVERHEAD + robots_module.PARSED_BYTES_PER_BYTE * len(robots)
    monkeypatch.setattr(robots_module, "MAX_RULES_BYTES", 2 * size)
    names = ["a.test", "b.test", "c.test"]
    async with (
        SyntheticWeb([Site(name=name, pages=2, robots=robots) for name in names]) as net,
        Fetcher(fetch_settings(net)) as fetcher,
    ):
        for name in [*names, "b.test", "a.test"]:  # c pushes a out; a then pushes c out
            await fetcher.fetch(net.url(name, "/page/1"))
        kept = list(fetcher.robots._rules)
        assert fetcher.robots._size == 2 * size
    assert kept == [f"http://{name}:{net.ports[name]}" for name in ("b.test", "a.test")]
    asked = [h.host for h in net.hits if h.path == "/robots.txt"]
    assert asked == ["a.test", "b.test", "c.test", "a.test"]


def hostile_robots(patterns: int) -> str:
    """`patterns` wildcard rules protego matches one by one, and /page/1 disallowed."""
    rules = "".join(f"Disallow: /*x*y*z{n}\n" for n in range(patterns))
    return f"User-agent: *\nDisallow: /page/1$\n{rules}"


async def test_a_robots_txt_of_many_wildcard_rules_is_matched_off_the_event_loop() -> None:
    """Matching a URL against 20,000 wildcard rules takes protego tens of milliseconds: the
    event loop keeps turning meanwhile, and the rules are still obeyed."""
    text = hostile_robots(20_000)
    assert len(text) <= MAX_ROBOTS_BYTES
    site = Site(name="a.test", pages=3, robots=text)
    async with SyntheticWeb([site]) as net, Fetcher(fetch_settings(net)) as fetcher:
        await fetcher.robots.check(net.url("a.test", "/page/0"))  # fetched and parsed
        turns = 0
        checking = True

        async def count_turns() -> None:
            nonlocal turns
            while checking:
                turns += 1
                await asyncio.sleep(0)

        counter = asyncio.create_task(count_turns())
        await asyncio.sleep(0)
        started = turns
        await fetcher.robots.check(net.url("a.test", "/page/2"))
        during = turns - started
        checking = False
        await counter
        with pytest.raises(FetchError) as refused:
            await fetcher.robots.check(net.url("a.test", "/page/1"))
        rules = await fetcher.robots.rules(net.url("a.test"))
    assert during >= 1  # inline, the check would not let the loop turn once
    assert rules.costly
    assert refused.value.reason is Reason.ROBOTS_DISALLOWED


async def test_links_under_costly_rules_are_judged_when_fetched(tmp_path: Path) -> None:
    """Under costly rules a page's links are not matched one by one as they are found (each
    match could take milliseconds): they are queued, and a disallowed one is refused, not
    fetched, when its turn comes."""
    site = Site(name="a.test", pages=4, robots=hostile_robots(2_000))
    async with SyntheticWeb([site]) as net:
        crawl = Crawl(crawl_settings(net, tmp_path))
        await crawl.run([net.url("a.test")])
    assert [h.path for h in net.hits_for("a.test", pages_only=True)] == [
        "/page/0",
        "/page/2",
        "/page/3",
    ]
    record = records_by_url(tmp_path)[net.url("a.test", "/page/1")]
    assert [r["error"] for r in record] == ["robots_disallowed"]
