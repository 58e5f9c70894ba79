"""Whole crawls in one process against the synthetic web: coverage, WARC storage, robots,
Crawl-delay, Retry-After, backoff, scope, budget, and errors as data."""

from __future__ import annotations

import asyncio
import itertools
import signal
import socket
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from crawlq import Context, Retry
from crawlq.app import App
from crawlq.crawl import crawler, page_reader
from crawlq.crawl.crawler import PAGES_FILE, WARC_DIR, Crawl
from crawlq.crawl.errors import FetchError, Reason, Throttled
from crawlq.crawl.fetcher import Fetcher
from crawlq.crawl.links import MAX_LINKS, MAX_TITLE_CHARS, TITLE_CUT
from crawlq.crawl.politeness import MAX_PACING_WAIT, Backoff
from crawlq.crawl.records import read_records
from crawlq.crawl.scope import Scope
from crawlq.crawl.settings import Timeouts
from crawlq.crawl.store import WarcStore
from crawlq.crawl.testing import Site, SyntheticWeb, hang, redirect, respond
from crawlq.crawl.testing.sites import more_links, page_html
from crawlq.worker import Worker

from .conftest import FAST_RETRY, crawl_settings, fetch_settings, started_children


def records_by_url(out: Path) -> dict[str, list[dict[str, Any]]]:
    grouped: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for record in read_records(out / PAGES_FILE):
        grouped[str(record["url"])].append(record)
    return dict(grouped)


async def test_every_page_fetched_once_and_every_response_readable_from_the_warc_index(
    tmp_path: Path,
) -> None:
    async with SyntheticWeb([Site(name="a.test", pages=25), Site(name="b.test", pages=6)]) as net:
        net.sites["a.test"].cross_links = [net.url("b.test")]
        crawl = Crawl(crawl_settings(net, tmp_path))
        stats = await crawl.run([net.url("a.test")], concurrency=20)
    expected = sorted(net.page_urls("a.test") + net.page_urls("b.test"))
    records = records_by_url(tmp_path)
    assert sorted(records) == expected
    assert all(len(r) == 1 and r[0]["status"] == 200 for r in records.values())
    assert records[net.url("a.test", "/page/4")][0]["title"] == "a.test page 4"
    assert stats.done == len(expected)
    page_hits = [net.url(h.host, h.path) for h in net.hits if h.path != "/robots.txt"]
    assert sorted(page_hits) == expected  # each page requested exactly once
    assert sorted(h.host for h in net.hits if h.path == "/robots.txt") == ["a.test", "b.test"]
    store = WarcStore(tmp_path / WARC_DIR)
    stored = await store.get(net.url("a.test", "/page/7"))
    await store.aclose()
    assert stored is not None and stored.status == 200
    assert b"<title>a.test page 7</title>" in stored.raw
    assert len(store.refs(net.url("b.test", "/page/5"))) == 1


async def test_pages_linking_in_every_form_real_pages_use_are_each_fetched_once(
    tmp_path: Path,
) -> None:
    """Root-relative, relative, ../, absolute, with a #fragment, to the page's own sections:
    every form resolves to one canonical URL, fetched once; and a page's record counts its
    distinct links."""
    site = Site(name="a.test", pages=40, links=60, text=3_000)
    async with SyntheticWeb([site]) as net:
        crawl = Crawl(crawl_settings(net, tmp_path))
        await crawl.run([net.url("a.test")], concurrency=20)
    records = records_by_url(tmp_path)
    assert sorted(records) == sorted(net.page_urls("a.test"))
    assert all(len(r) == 1 and r[0]["status"] == 200 for r in records.values())
    page_hits = [net.url(h.host, h.path) for h in net.hits if h.path != "/robots.txt"]
    assert sorted(page_hits) == sorted(net.page_urls("a.test"))
    for number in range(site.pages):
        targets = {n for n in (number + 1, 2 * number + 1, 2 * number + 2) if n < site.pages}
        for link in more_links(number, site.pages, site.links, "http://a.test"):
            if not link.startswith("#"):  # the others end in the page's number
                targets.add(int(link.split("#")[0].rsplit("/", 1)[-1]))
        (record,) = records[net.url("a.test", f"/page/{number}")]
        assert record["links"] == len(targets)
    assert all(r[0]["bytes"] > 3_000 for r in records.values())


async def test_pages_of_many_tags_are_read_for_links_in_child_processes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same links as read on the event loop, for every page."""
    site = Site(name="a.test", pages=12, links=10, text=3_000)
    async with SyntheticWeb([site]) as net:
        await Crawl(crawl_settings(net, tmp_path / "inline")).run([net.url("a.test")])
        monkeypatch.setattr(page_reader, "INLINE_CHARS", 100)
        monkeypatch.setattr(page_reader, "THREAD_CHARS", 100)
        started = started_children(monkeypatch)
        await Crawl(crawl_settings(net, tmp_path / "child")).run([net.url("a.test")])
    inline, child = records_by_url(tmp_path / "inline"), records_by_url(tmp_path / "child")
    assert sorted(child) == sorted(net.page_urls("a.test"))
    assert {url: r[0]["links"] for url, r in child.items()} == {
        url: r[0]["links"] for url, r in inline.items()
    }
    assert 1 <= len(started) <= page_reader.PROCESSES
    assert all(process.returncode is not None for process in started)  # none left running


async def test_a_page_too_slow_to_parse_is_recorded_without_its_links_and_the_crawl_goes_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Tens of thousands of nested blocks make lexbor's parse quadratic: seconds for this
    page (40,000 of them, 200 KB), which a worker's event loop cannot wait for; its child
    process is killed at the timeout, not left to run on."""
    monkeypatch.setattr(page_reader, "PARSE_TIMEOUT", 0.5)
    started = started_children(monkeypatch)
    nested = page_html("deep", ["/only-from-the-deep-page"], "<div>" * 40_000)
    site = Site(name="a.test", pages=4, routes={"/page/1": respond(body=nested)})
    async with SyntheticWeb([site]) as net:
        crawl = Crawl(crawl_settings(net, tmp_path))
        await crawl.run([net.url("a.test")], concurrency=4)
    records = records_by_url(tmp_path)
    (deep,) = records[net.url("a.test", "/page/1")]
    assert (deep["status"], deep["error"], deep["links"]) == (200, "timeout", 0)
    assert "links not read: parsing the page took over 0.5s" in str(deep["detail"])
    assert sorted(records) == sorted(net.page_urls("a.test"))  # the others link to 2 and 3
    assert "/only-from-the-deep-page" not in {hit.path for hit in net.hits}
    assert crawl.stats.errors == 1
    assert [process.returncode for process in started] == [-signal.SIGKILL]


async def test_robots_disallowed_pages_are_never_requested_and_crawl_delay_spaces_requests(
    tmp_path: Path,
) -> None:
    robots = "User-agent: *\nDisallow: /page/3\nCrawl-delay: 1\n"
    async with SyntheticWeb([Site(name="a.test", pages=5, robots=robots)]) as net:
        crawl = Crawl(crawl_settings(net, tmp_path, concurrency_per_domain=3))
        await crawl.run([net.url("a.test")])
        backend = await crawl.app.backend()
        crawl_delays = await backend.crawl_delays()
        (group,) = await backend.group_stats("a.test", include_idle=True)
        await crawl.app.aclose()
    records = records_by_url(tmp_path)
    assert records[net.url("a.test", "/page/3")][0]["error"] == Reason.ROBOTS_DISALLOWED
    assert "/page/3" not in [h.path for h in net.hits]
    assert crawl_delays == {"a.test": 1.0}
    assert group.limit.interval == 1.0
    pages = net.hits_for("a.test", pages_only=True)
    assert [h.path for h in pages][:1] == ["/page/0"]
    assert len(pages) == 4  # 0, 1, 2 and 4
    # The queue spaces the claims 1 s apart; each request follows its claim within ms.
    gaps = [later.at - earlier.at for earlier, later in itertools.pairwise(pages)]
    assert min(gaps) > 0.5, gaps
    assert net.peak_concurrency("a.test") == 1


async def test_crawl_delay_spaces_the_requests_of_seeds_claimed_before_robots_txt_came(
    tmp_path: Path,
) -> None:
    """Four seeds of one host claimed at once (4 at a time allowed, no interval yet): one
    fetches robots.txt, the others wait for it, and each page then goes a Crawl-delay after
    the previous request. They were paced by the interval known before robots.txt: all four
    pages went within milliseconds of it."""
    robots = "User-agent: *\nCrawl-delay: 0.3\n"
    async with SyntheticWeb([Site(name="a.test", pages=4, robots=robots)]) as net:
        crawl = Crawl(crawl_settings(net, tmp_path, concurrency_per_domain=4))
        await crawl.run([net.url("a.test", f"/page/{n}") for n in range(4)])
    hits = net.hits_for("a.test")
    assert [h.path for h in hits][:1] == ["/robots.txt"] and len(hits) == 5
    gaps = [later.at - earlier.at for earlier, later in itertools.pairwise(hits)]
    assert min(gaps) > 0.25, gaps  # arrivals: a busy server notes one a few ms late


async def test_a_crawl_delay_longer_than_a_request_may_wait_still_lets_every_page_through(
    tmp_path: Path,
) -> None:
    """A page whose request would wait more than MAX_PACING_WAIT is put back until its time.
    It left its send reservation behind, so each try found it and was put back a Crawl-delay
    later again: a host asking for more than 2 s was never fetched past robots.txt."""
    delay = MAX_PACING_WAIT + 0.5
    robots = f"User-agent: *\nCrawl-delay: {delay}\n"
    async with SyntheticWeb([Site(name="a.test", pages=2, robots=robots)]) as net:
        crawl = Crawl(crawl_settings(net, tmp_path))
        await crawl.run([net.url("a.test")])
    hits = net.hits_for("a.test")
    assert [h.path for h in hits] == ["/robots.txt", "/page/0", "/page/1"]
    gaps = [later.at - earlier.at for earlier, later in itertools.pairwise(hits)]
    assert min(gaps) > delay - 0.05, gaps  # arrivals: a busy server notes one a few ms late


async def test_a_link_robots_txt_refuses_when_found_takes_no_turn_of_its_hosts_interval(
    tmp_path: Path,
) -> None:
    """/page/3 is found on /page/1, once this worker has a.test's robots.txt: it is queued in
    no group, so it does not hold up the host's next page by an interval, and it is recorded
    as refused without a request. /page/0, a seed, is queued before robots.txt is known."""
    robots = "User-agent: *\nDisallow: /page/3\n"
    async with SyntheticWeb([Site(name="a.test", pages=5, robots=robots)]) as net:
        crawl = Crawl(crawl_settings(net, tmp_path, delay=0.2))
        groups: dict[str, str] = {}
        visit = crawl.task.function

        async def recording(ctx: Context, element: dict[str, Any]) -> None:
            groups[element["url"]] = ctx.group
            await visit(ctx, element)

        crawl.task.function = recording
        await crawl.run([net.url("a.test")])
    assert groups == {net.url("a.test", f"/page/{n}"): "a.test" for n in (0, 1, 2, 4)} | {
        net.url("a.test", "/page/3"): ""
    }
    record = records_by_url(tmp_path)[net.url("a.test", "/page/3")]
    assert [(r["error"], r["retry"], r["status"]) for r in record] == [
        (Reason.ROBOTS_DISALLOWED, False, None)
    ]
    assert "/page/3" not in [h.path for h in net.hits]


async def test_retry_after_blocks_the_host_and_no_request_arrives_before_that_time(
    tmp_path: Path,
) -> None:
    answered: list[int] = []

    async def throttle_once(request: web.Request) -> web.StreamResponse:
        answered.append(1)
        if len(answered) == 1:
            return web.Response(status=429, text="slow down", headers={"Retry-After": "2"})
        return web.Response(text="<title>finally</title>", content_type="text/html")

    site = Site(name="a.test", pages=4, routes={"/page/1": throttle_once})
    async with SyntheticWeb([site]) as net:
        crawl = Crawl(crawl_settings(net, tmp_path, concurrency_per_domain=1))
        await crawl.run([net.url("a.test")])
        backend = await crawl.app.backend()
        (group,) = await backend.group_stats("a.test", include_idle=True)
        await crawl.app.aclose()
    hits = net.hits_for("a.test")
    (throttled,) = [i for i, h in enumerate(hits) if h.path == "/page/1"][:1]
    assert throttled + 1 < len(hits)
    answered_at = hits[throttled].ended
    assert answered_at is not None
    for later in hits[throttled + 1 :]:
        assert later.at >= answered_at + 2.0
    records = records_by_url(tmp_path)[net.url("a.test", "/page/1")]
    assert [(r["status"], r["error"]) for r in records] == [(429, "throttled"), (200, None)]
    assert records[0]["retry"] is True
    assert group.block_reason is not None and "429" in group.block_reason
    assert len(records_by_url(tmp_path)) == 4


async def test_a_page_its_host_keeps_throttling_is_dead_lettered_after_its_attempts(
    tmp_path: Path,
) -> None:
    """Each 429 is an attempt, each retry waits out its Retry-After; the crawl then ends."""
    refuse = respond(429, "slow down", headers={"Retry-After": "1"})
    site = Site(name="a.test", pages=3, routes={"/page/1": refuse})
    async with SyntheticWeb([site]) as net:
        crawl = Crawl(crawl_settings(net, tmp_path, concurrency_per_domain=1))
        stats = await crawl.run([net.url("a.test")])
        backend = await crawl.app.backend()
        (dead,) = await backend.dead_letters("crawl")
        await crawl.app.aclose()
    refused = [h for h in net.hits_for("a.test") if h.path == "/page/1"]
    assert len(refused) == FAST_RETRY.max_attempts == 3
    for before, after in itertools.pairwise(refused):
        assert before.ended is not None and after.at >= before.ended + 1.0
    assert (stats.dead, crawl.stats.throttled, dead.attempts) == (1, 3, 3)
    assert "429 Retry-After 1" in dead.error
    records = records_by_url(tmp_path)[net.url("a.test", "/page/1")]
    assert [(r["status"], r["error"], r["retry"]) for r in records] == [
        (429, "throttled", True),
        (429, "throttled", True),
        (429, "throttled", False),
    ]
    assert len(records_by_url(tmp_path)) == 3


async def test_repeated_server_errors_back_the_host_off_then_the_page_is_dead_lettered(
    tmp_path: Path,
) -> None:
    site = Site(name="a.test", pages=2, routes={"/page/1": respond(500, "broken")})
    async with SyntheticWeb([site]) as net:
        settings = crawl_settings(
            net, tmp_path, backoff=Backoff(after=2, base=1.0, factor=2.0, cap=10.0)
        )
        crawl = Crawl(settings)
        stats = await crawl.run([net.url("a.test")])
        backend = await crawl.app.backend()
        (dead,) = await backend.dead_letters("crawl")
        (group,) = await backend.group_stats("a.test", include_idle=True)
        await crawl.app.aclose()
    broken = [h for h in net.hits_for("a.test") if h.path == "/page/1"]
    assert len(broken) == FAST_RETRY.max_attempts == 3
    assert broken[1].ended is not None and broken[2].at >= broken[1].ended + 1.0  # backed off
    assert (stats.dead, dead.attempts) == (1, 3)
    assert "server_error" in dead.error
    records = records_by_url(tmp_path)[net.url("a.test", "/page/1")]
    assert [(r["status"], r["error"], r["retry"]) for r in records] == [
        (500, "server_error", True),
        (500, "server_error", True),
        (500, "server_error", False),
    ]
    assert group.block_reason is not None and "backing off 2s" in group.block_reason


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.1.250", 0))
        return int(sock.getsockname()[1])


async def test_errors_are_recorded_with_their_reason_and_retried_or_finished_per_policy(
    tmp_path: Path,
) -> None:
    release = asyncio.Event()
    site = Site(
        name="a.test",
        pages=1,
        routes={
            "/slow": hang(release),
            "/big": respond(200, "x" * 50_000),
            "/bad": respond(200, b"<html><title>caf\xe9</title>\xff</html>"),
            "/loop": redirect("/loop2"),
            "/loop2": redirect("/loop"),
        },
    )
    async with SyntheticWeb([site]) as net:
        try:
            port = closed_port()
            fetch = fetch_settings(
                net,
                resolve={**net.resolve, "refused.test": "127.0.1.250"},
                timeouts=Timeouts(connect=2, read=1.0, total=5),
                max_bytes=20_000,
            )
            cases = {
                "http://nowhere.test/": Reason.DNS,
                f"http://refused.test:{port}/": Reason.REFUSED,
                net.url("a.test", "/page/0").replace("http:", "https:"): Reason.TLS,
                net.url("a.test", "/slow"): Reason.TIMEOUT,
                net.url("a.test", "/big"): Reason.TOO_LARGE,
                net.url("a.test", "/bad"): Reason.BAD_ENCODING,
                net.url("a.test", "/loop"): Reason.REDIRECT_LOOP,
            }
            crawl = Crawl(crawl_settings(net, tmp_path, fetch=fetch, scope=Scope()))
            stats = await crawl.run([*cases, net.url("a.test", "/page/0")])
            backend = await crawl.app.backend()
            dead = {letter.key: letter for letter in await backend.dead_letters("crawl")}
            await crawl.app.aclose()
        finally:
            release.set()  # lets the hung request end, so the server can stop
    records = records_by_url(tmp_path)
    assert records[net.url("a.test", "/page/0")][0]["status"] == 200  # the worker survived
    for url, reason in cases.items():
        tries = records[url]
        assert {r["error"] for r in tries} == {reason.value}, url
        assert all(r["detail"] for r in tries)
        if reason in (Reason.DNS, Reason.REFUSED, Reason.TIMEOUT):
            assert len(tries) == 3 and [r["retry"] for r in tries] == [True, True, False]
            assert reason.value in dead[url].error
        else:
            assert len(tries) == 1 and tries[0]["retry"] is False, url
            assert url not in dead
    assert records[net.url("a.test", "/bad")][0]["status"] == 200
    assert stats.dead == 3


async def test_depth_limit_and_page_budget(tmp_path: Path) -> None:
    async with SyntheticWeb([Site(name="a.test", pages=30)]) as net:
        shallow = Crawl(crawl_settings(net, tmp_path / "shallow", scope=Scope(max_depth=1)))
        await shallow.run([net.url("a.test")])
        budget = Crawl(crawl_settings(net, tmp_path / "budget", max_pages=5))
        await budget.run([net.url("a.test")])
    assert sorted(records_by_url(tmp_path / "shallow")) == sorted(
        net.url("a.test", f"/page/{n}") for n in (0, 1, 2)
    )
    assert len(records_by_url(tmp_path / "budget")) == 5


async def test_links_robots_txt_refuses_take_nothing_of_the_page_budget(tmp_path: Path) -> None:
    """/page/0 links /page/1 (refused) and /page/2; /page/2 links /page/3, 5 and 6. A budget
    of 3 pages fetches 0, 2 and 3: the refused link, recorded without a request, used to
    take a page of it."""
    site = Site(name="a.test", pages=7, robots="User-agent: *\nDisallow: /page/1\n")
    async with SyntheticWeb([site]) as net:
        crawl = Crawl(crawl_settings(net, tmp_path, max_pages=3, concurrency_per_domain=1))
        await crawl.run([net.url("a.test")])
    fetched = [h.path for h in net.hits_for("a.test", pages_only=True)]
    assert sorted(fetched) == ["/page/0", "/page/2", "/page/3"]
    refused = records_by_url(tmp_path)[net.url("a.test", "/page/1")]
    assert [r["error"] for r in refused] == ["robots_disallowed"]


async def test_a_url_a_redirect_led_to_is_fetched_once_and_takes_nothing_of_the_budget(
    tmp_path: Path, url: str
) -> None:
    """/a links /dir, which redirects to /dir/, and /b, which links /dir/ and /c; one page at
    a time, in the order found, so /dir is done before /b starts. /dir/ was fetched with
    /dir: /b's link to it is not fetched again. A budget of 4 pages fetches /c as well: the
    URL a redirect led to takes no page of it."""
    async with SyntheticWeb([redirecting_site(["/dir", "/b"])]) as net:
        settings = crawl_settings(net, tmp_path, max_pages=4, concurrency_per_domain=1)
        crawl = Crawl(settings, backend=url)
        await crawl.run([net.url("a.test", "/a")])
    fetched = [h.path for h in net.hits_for("a.test", pages_only=True)]
    assert sorted(fetched) == ["/a", "/b", "/c", "/dir", "/dir/"]
    records = records_by_url(tmp_path)
    assert sorted(records) == [net.url("a.test", path) for path in ("/a", "/b", "/c", "/dir")]
    assert [
        (r["status"], r["final_url"], r["title"]) for r in records[net.url("a.test", "/dir")]
    ] == [(200, net.url("a.test", "/dir/"), "dir")]
    assert (crawl.stats.pages, crawl.budget.used()) == (4, 4)


async def test_a_page_with_a_link_too_long_to_queue_is_crawled_with_its_other_links(
    tmp_path: Path,
) -> None:
    """A link of 70,000 characters, as a page's junk or a hostile page writes, made the page
    fail (its element too large for the queue) until it was dead, none of its links
    followed. It is no link: the page and its other links are crawled."""
    long_link = "/a" + "x" * 70_000
    site = Site(
        name="a.test",
        routes={
            "/": respond(200, page_html("home", ["/ok", long_link, "/ok2"])),
            "/ok": respond(200, page_html("ok", [])),
            "/ok2": respond(200, page_html("ok2", [])),
        },
    )
    async with SyntheticWeb([site]) as net:
        stats = await Crawl(crawl_settings(net, tmp_path)).run([net.url("a.test", "/")])
    records = records_by_url(tmp_path)
    assert sorted(records) == [net.url("a.test", p) for p in ("/", "/ok", "/ok2")]
    assert [(r["status"], r["links"]) for r in records[net.url("a.test", "/")]] == [(200, 2)]
    assert stats.dead == 0


@pytest.mark.parametrize("domains", [(), ("a.test",)])
async def test_links_to_hosts_no_request_can_go_to_are_out_of_scope_not_a_failed_page(
    tmp_path: Path, domains: tuple[str, ...]
) -> None:
    """Links to 1.2.3.4.5 or a%20b.a.test were let through by the scope (no domains, or a
    host read loosely) and failed the page's schedule (the element's group cannot be read):
    the page went to the dead letters, none of its links followed."""
    bad = ["http://1.2.3.4.5/x", "http://999.999.999.999/", "http://a%20b.a.test/"]
    site = Site(
        name="a.test",
        routes={
            "/": respond(200, page_html("home", ["/ok", *bad])),
            "/ok": respond(200, page_html("ok", [])),
        },
    )
    async with SyntheticWeb([site]) as net:
        settings = crawl_settings(net, tmp_path, scope=Scope(domains=domains))
        stats = await Crawl(settings).run([net.url("a.test", "/")])
    records = records_by_url(tmp_path)
    assert sorted(records) == [net.url("a.test", p) for p in ("/", "/ok")]
    assert [(r["status"], r["queued"]) for r in records[net.url("a.test", "/")]] == [(200, 1)]
    assert stats.dead == 0


async def test_a_url_a_redirect_led_to_is_free_for_another_process_of_the_crawl(
    tmp_path: Path,
) -> None:
    """The process that followed the redirect knows its target; another process of the crawl
    (a resumed one here, or one of --processes N) finds a link to it and must neither fetch
    it nor pay a page of the budget for it."""
    async with SyntheticWeb([redirecting_site(["/dir"])]) as net:
        settings = crawl_settings(net, tmp_path, max_pages=4, concurrency_per_domain=1)
        await Crawl(settings).run([net.url("a.test", "/a")])
        resumed = Crawl(settings)
        await resumed.run([net.url("a.test", "/b")])
    fetched = [h.path for h in net.hits_for("a.test", pages_only=True)]
    assert sorted(fetched) == ["/a", "/b", "/c", "/dir", "/dir/"]
    assert resumed.budget.used() == 4


async def test_redirects_to_another_host_wait_for_that_hosts_limits(tmp_path: Path) -> None:
    """Pages of 12 hosts each redirect to a page of c.test, which answers slowly and allows
    one request at a time: the hops to c.test are queued as pages of c.test, so at most one
    is in flight there however many hosts redirect to it. Each redirecting page's record
    says where it led, as one link."""
    release = asyncio.Event()
    senders = [f"s{n}.test" for n in range(12)]
    sites = [
        Site(name=name, routes={"/go": redirect(f"http://c.test/from/{name}", 301)})
        for name in senders
    ]
    target = Site(name="c.test", routes={f"/from/{name}": hang(release) for name in senders})
    async with SyntheticWeb([*sites, target]) as net:
        for site in sites:  # with the port the web was given
            site.routes["/go"] = redirect(net.url("c.test", f"/from/{site.name}"), 301)
        settings = crawl_settings(net, tmp_path, concurrency_per_domain=1)
        crawl = Crawl(settings)
        running = asyncio.create_task(
            crawl.run([net.url(name, "/go") for name in senders], concurrency=30)
        )
        # c.test holds its answers until every redirecting page is done (handed off), or,
        # were hops followed in place, until each has its request in flight at c.test.
        deadline = asyncio.get_running_loop().time() + 30
        while crawl.stats.pages < len(senders) and len(
            net.hits_for("c.test", pages_only=True)
        ) < len(senders):
            assert asyncio.get_running_loop().time() < deadline
            await asyncio.sleep(0.01)
        release.set()
        await running
        peak = net.peak_concurrency("c.test")
    assert peak == 1
    records = records_by_url(tmp_path)
    for name in senders:
        (moved,) = records[net.url(name, "/go")]
        assert (moved["status"], moved["links"], moved["queued"], moved["error"]) == (
            301,
            1,
            1,
            None,
        )
        (landed,) = records[net.url("c.test", f"/from/{name}")]
        assert landed["status"] == 200
    assert len(net.hits_for("c.test", pages_only=True)) == len(senders)


def redirecting_site(links_of_a: list[str]) -> Site:
    """/a links `links_of_a`; /dir redirects to /dir/; /b links /dir/ and /c."""
    return Site(
        name="a.test",
        routes={
            "/a": respond(200, page_html("a", links_of_a)),
            "/dir": redirect("/dir/", 301),
            "/dir/": respond(200, page_html("dir", [])),
            "/b": respond(200, page_html("b", ["/dir/", "/c"])),
            "/c": respond(200, page_html("c", [])),
        },
    )


async def test_a_user_task_fetches_politely_through_its_context(tmp_path: Path) -> None:
    robots = "User-agent: *\nDisallow: /private\n"
    outcomes: dict[str, str] = {}
    waits: list[float] = []

    async def throttled(request: web.Request) -> web.StreamResponse:
        return web.Response(status=503, headers={"Retry-After": "3600"})

    site = Site(name="a.test", robots=robots, routes={"/busy": throttled})
    async with SyntheticWeb([site]) as net:
        app = App(f"sqlite:///{tmp_path / 'q.db'}")
        app.provide("crawlq.fetcher", lambda: Fetcher(fetch_settings(net)))

        @app.task(retry=Retry(max_attempts=1))
        async def visit(ctx: Context, url: str) -> None:
            try:
                response = await ctx.fetch(url)
                outcomes[url] = str(response.status)
            except Throttled as exc:
                waits.append(exc.until - ctx.claimed_at)
                outcomes[url] = "throttled"
            except FetchError as exc:
                outcomes[url] = exc.reason.value

        await app.aschedule_many(visit, [net.url("a.test", p) for p in ("/page/0", "/private")])
        await Worker(app, burst=True).run()
        await app.aschedule(visit, net.url("a.test", "/busy"))
        await Worker(app, burst=True, burst_horizon=1).run()
        backend = await app.backend()
        (group,) = await backend.group_stats("a.test", include_idle=True)
        await app.aclose()
    assert outcomes[net.url("a.test", "/page/0")] == "200"
    assert outcomes[net.url("a.test", "/private")] == "robots_disallowed"
    assert outcomes[net.url("a.test", "/busy")] == "throttled"
    assert len(waits) == 1 and 3500 < waits[0] < 3610
    assert group.blocked_until is not None and group.block_reason == "503 Retry-After 3600"


async def test_the_synthetic_web_serves_more_sites_than_one_address_block_holds() -> None:
    sites = [Site(name=f"s{n}.test", pages=1) for n in range(300)]
    async with SyntheticWeb(sites) as net:
        addresses = [net.addresses[site.name] for site in sites]
        assert len(set(addresses)) == 300
        assert addresses[253:255] == ["127.0.1.254", "127.0.2.1"]
        reader, writer = await asyncio.open_connection(addresses[299], net.ports["s299.test"])
        writer.write(b"GET /page/0 HTTP/1.1\r\nHost: s299.test\r\nConnection: close\r\n\r\n")
        answer = await reader.read()
        writer.close()
    assert answer.startswith(b"HTTP/1.1 200")
    assert [(hit.host, hit.path) for hit in net.hits] == [("s299.test", "/page/0")]


@pytest.mark.parametrize("memory", [0.0, 300.0])
async def test_seeds_are_kept_for_a_redis_back_from_a_crash_only_for_a_while(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, memory: float
) -> None:
    """A crash in the first seconds of a crawl loses the seeds; a million seeds kept in
    memory for the whole crawl would cost about 300 MB."""
    monkeypatch.setattr(crawler, "SEED_MEMORY", memory)
    async with SyntheticWeb([Site(name="a.test", pages=3)]) as net:
        crawl = Crawl(crawl_settings(net, tmp_path))
        await crawl.run([net.url("a.test"), net.url("a.test", "/page/2")])
    assert sorted(records_by_url(tmp_path)) == sorted(net.page_urls("a.test"))
    assert len(crawl._seeds) == (2 if memory else 0)


async def test_a_hostile_page_puts_a_capped_title_and_links_in_its_record_and_queue(
    tmp_path: Path,
) -> None:
    """A 300 KB <title> made a 300 KB line of pages.jsonl, and every one of a page's links
    went into one schedule: the title is cut to MAX_TITLE_CHARS characters and only the
    first MAX_LINKS links are followed, the rest counted on the record as `links_dropped`.
    (robots.txt refuses the links: each is recorded, none fetched.)"""
    extra = 300
    hrefs = [f"/p/{n}" for n in range(MAX_LINKS + extra)]
    site = Site(
        name="a.test",
        robots="User-agent: *\nDisallow: /p/\n",
        routes={"/": respond(200, page_html("t" * 300_000, hrefs))},
    )
    async with SyntheticWeb([site]) as net:
        await Crawl(crawl_settings(net, tmp_path)).run([net.url("a.test", "/")])
    lines = (tmp_path / PAGES_FILE).read_bytes().splitlines()
    assert max(len(line) for line in lines) < 4_000
    records = records_by_url(tmp_path)
    [home] = records.pop(net.url("a.test", "/"))
    assert home["title"] == "t" * (MAX_TITLE_CHARS - len(TITLE_CUT)) + TITLE_CUT
    assert (home["links"], home["links_dropped"], home["queued"]) == (MAX_LINKS, extra, MAX_LINKS)
    assert sorted(records) == sorted(net.url("a.test", href) for href in hrefs[:MAX_LINKS])
    assert [hit.path for hit in net.hits_for("a.test", pages_only=True)] == ["/"]
