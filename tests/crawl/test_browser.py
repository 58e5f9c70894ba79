"""Browser fetching in Debian's headless Chromium (driven by Playwright) against the synthetic
web: links only JavaScript writes, and every request the browser makes sent by crawlq's
fetcher, so robots.txt, the host's interval and concurrency, scope and the address guard hold
for scripts and fetch() calls as for pages. Every request a server logged carries crawlq's
User-Agent, not Chromium's: none came from Chromium itself."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import os
import sys
import tracemalloc
from collections import Counter
from pathlib import Path
from typing import Any

import psutil
import pytest
from aiohttp import web
from warcio.archiveiterator import ArchiveIterator

from crawlq import Context, Retry
from crawlq.app import App
from crawlq.crawl.browser import (
    DEFAULT_CHROMIUM,
    Browser,
    BrowserSettings,
    Rendered,
    ResourceFetch,
)
from crawlq.crawl.crawler import PAGES_FILE, WARC_DIR, Crawl
from crawlq.crawl.errors import FetchError, Reason
from crawlq.crawl.fetcher import Fetcher
from crawlq.crawl.records import read_records
from crawlq.crawl.response import Response
from crawlq.crawl.scope import Scope
from crawlq.crawl.settings import DEFAULT_USER_AGENT, FetchSettings
from crawlq.crawl.store import WarcStore
from crawlq.crawl.testing import Site, SyntheticWeb, hang, redirect, respond
from crawlq.crawl.testing.sites import page_html
from crawlq.errors import ConfigError
from crawlq.grouping import url_host
from crawlq.worker import Worker, WorkerStats

from .conftest import crawl_settings, fetch_settings

JS = "application/javascript"


@pytest.fixture(autouse=True)
def chromium() -> None:
    """Chromium is a requirement of these tests, not an option: missing, they fail."""
    if not os.path.exists(DEFAULT_CHROMIUM):
        pytest.fail(f"{DEFAULT_CHROMIUM} is missing: run `bash scripts/install-chromium.sh`")
    os.environ.setdefault("PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD", "1")


def insert(html: str) -> str:
    """A script adding `html` at the end of the page's body."""
    return f"document.body.insertAdjacentHTML('beforeend', {json.dumps(html)});"


def page(title: str, scripts: str = "") -> Any:
    return respond(body=page_html(title, [], scripts))


def records_by_path(out: Path) -> dict[str, dict[str, Any]]:
    return {str(r["url"]).split("/", 3)[3]: r for r in read_records(out / PAGES_FILE)}


async def render_in_a_task(
    tmp_path: Path,
    fetch: FetchSettings,
    url: str,
    *,
    wait_for: str,
    limit: dict[str, Any] | None = None,
) -> tuple[WorkerStats, list[Rendered]]:
    """A task that renders `url` once (`ctx.render`, one attempt), run by a burst worker;
    the worker's stats and what the task rendered. `limit`: `App.limit` for `url`'s host."""
    rendered: list[Rendered] = []
    app = App(f"sqlite:///{tmp_path / 'q.db'}")
    if limit is not None:
        app.limit(url_host(url), **limit)
    app.provide("crawlq.fetcher", lambda: Fetcher(fetch))

    @app.task(retry=Retry(max_attempts=1))
    async def visit(ctx: Context, url: str) -> None:
        rendered.append(await ctx.render(url, wait_for=wait_for))

    await app.aschedule(visit, url)
    stats = await Worker(app, burst=True).run()
    await app.aclose()
    return stats, rendered


def direct(fetcher: Fetcher) -> ResourceFetch:
    """A page's requests fetched by `fetcher` alone, for `Browser.render` in a test."""

    async def fetch(
        url: str, method: str, headers: Any, data: bytes | None, credentials: Any
    ) -> Response:
        return await fetcher.fetch(
            url, method=method, headers=headers, data=data, credentials=credentials
        )

    return fetch


def only_crawlq_sent(net: SyntheticWeb) -> None:
    agents = {hit.headers.get("User-Agent") for hit in net.hits}
    assert agents == {DEFAULT_USER_AGENT}, agents


async def test_links_only_javascript_writes_are_followed_when_rendering(tmp_path: Path) -> None:
    routes = {
        "/": page("app", '<script src="/app.js"></script>'),
        "/app.js": respond(
            body=insert('<a href="/page/1">1</a><a href="/page/2">2</a>'), content_type=JS
        ),
    }
    async with SyntheticWeb([Site(name="js.test", pages=3, routes=routes)]) as net:
        plain = Crawl(crawl_settings(net, tmp_path / "plain"))
        await plain.run([net.url("js.test", "/")])
        plain_hits = [h.path for h in net.hits]
        net.hits.clear()
        rendered = Crawl(crawl_settings(net, tmp_path / "rendered", render=True))
        stats = await rendered.run([net.url("js.test", "/")])
    # Without a browser the page has no links: nothing else is requested.
    assert sorted(plain_hits) == ["/", "/robots.txt"]
    assert records_by_path(tmp_path / "plain")[""]["links"] == 0
    # Rendered, the links the script wrote are found, followed and rendered in turn.
    records = records_by_path(tmp_path / "rendered")
    assert sorted(records) == ["", "page/1", "page/2"] and stats.done == 3
    assert records[""]["links"] == 2 and records[""]["queued"] == 2
    assert all(
        r["rendered"] and r["status"] == 200 and r["error"] is None for r in records.values()
    )
    assert records_by_path(tmp_path / "plain")[""]["rendered"] is None
    assert sorted(h.path for h in net.hits) == ["/", "/app.js", "/page/1", "/page/2", "/robots.txt"]
    only_crawlq_sent(net)
    # WARC holds the document as the server sent it, without the links the script wrote.
    store = WarcStore(tmp_path / "rendered" / WARC_DIR)
    stored = await store.get(net.url("js.test", "/"))
    dom = await store.get_rendition(net.url("js.test", "/"))
    await store.aclose()
    assert stored is not None and b'<script src="/app.js">' in stored.raw
    assert b"/page/1" not in stored.raw
    # ... and the rendered DOM beside it, in a conversion record the page record points to.
    assert dom is not None and '<a href="/page/1">1</a>' in dom.html
    assert records[""]["rendered"] != records[""]["warc"]
    # The page's script is not stored: WARC holds pages, and the DOMs rendered from them.
    kinds: Counter[str] = Counter()
    for path in (tmp_path / "rendered" / WARC_DIR).glob("*.warc.gz"):
        with path.open("rb") as file:
            for record in ArchiveIterator(file, check_digests="raise"):
                record.raw_stream.read()  # its digests checked
                kinds[record.rec_type] += 1
    assert kinds == {"warcinfo": 1, "response": 3, "conversion": 3}


async def test_a_script_robots_txt_disallows_is_never_requested_and_the_page_renders_without_it(
    tmp_path: Path,
) -> None:
    robots = "User-agent: *\nDisallow: /private/\n"
    scripts = (
        '<script src="/private/app.js"></script>'
        f"<script>{insert('<a id=inline href=/page/1>inline</a>')}</script>"
    )
    routes = {
        "/": page("robots", scripts),
        "/private/app.js": respond(
            body=insert("<a id=private href=/page/2>x</a>"), content_type=JS
        ),
    }
    async with SyntheticWeb([Site(name="a.test", robots=robots, routes=routes)]) as net:
        stats, rendered = await render_in_a_task(
            tmp_path, fetch_settings(net), net.url("a.test", "/"), wait_for="#inline"
        )
    assert stats.done == 1
    (result,) = rendered
    assert result.html is not None and 'id="inline"' in result.html
    assert 'id="private"' not in result.html
    assert "/private/app.js" not in [h.path for h in net.hits]
    assert sorted(h.path for h in net.hits) == ["/", "/robots.txt"]
    (refused,) = result.refused
    assert refused.url == net.url("a.test", "/private/app.js") and refused.kind == "script"
    assert refused.error == Reason.ROBOTS_DISALLOWED
    only_crawlq_sent(net)


async def test_crawlq_crawl_render_from_the_command_line(tmp_path: Path) -> None:
    """`crawlq crawl --render` in a subprocess, its Chromium from CRAWLQ_CHROMIUM."""
    routes = {
        "/": page("app", '<script src="/app.js"></script>'),
        "/app.js": respond(body=insert('<a href="/page/1">1</a>'), content_type=JS),
    }
    async with SyntheticWeb([Site(name="js.test", pages=2, routes=routes)]) as net:
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "crawlq",
            "crawl",
            net.url("js.test", "/"),
            "--out",
            str(tmp_path),
            "--resolve",
            f"js.test={net.addresses['js.test']}",
            "--resolve-only",
            "--allow-network",
            "127.0.0.0/8",
            "--no-progress",
            "--render",
            "--render-pages",
            "2",
            env=os.environ | {"CRAWLQ_CHROMIUM": DEFAULT_CHROMIUM},
            stderr=asyncio.subprocess.PIPE,
        )
        _, stderr = await asyncio.wait_for(process.communicate(), 90)
    assert process.returncode == 0, stderr.decode()
    records = records_by_path(tmp_path)
    assert sorted(records) == ["", "page/1"] and all(r["rendered"] for r in records.values())
    assert sorted(h.path for h in net.hits) == ["/", "/app.js", "/page/1", "/robots.txt"]
    only_crawlq_sent(net)


@pytest.mark.parametrize("delay", [0.3, 0.0], ids=["interval", "concurrency-only"])
async def test_a_hosts_interval_and_concurrency_hold_for_the_requests_of_a_rendered_page(
    tmp_path: Path, delay: float
) -> None:
    """Four scripts and a fetch() of one page, which Chromium asks for at once, go one at a
    time (the server takes 50 ms to answer each: requests sent at once would overlap in its
    log), and an interval apart if the host has one."""
    scripts = "".join(f'<script src="/s{n}.js"></script>' for n in range(4))
    data_js = (
        "fetch('/data.json').then(r => r.json()).then(links => document.body.insertAdjacentHTML("
        "'beforeend', links.map(l => `<a href=\"${l}\">${l}</a>`).join('')));"
    )
    routes: dict[str, Any] = {
        "/": page("paced", scripts + '<script src="/data.js"></script>'),
        "/data.js": respond(body=data_js, content_type=JS),
        "/data.json": respond(body=json.dumps(["/page/1"]), content_type="application/json"),
    }
    routes |= {f"/s{n}.js": respond(body=f"window.s{n} = {n};", content_type=JS) for n in range(4)}
    site = Site(name="a.test", latency=0.05, routes=routes)
    async with SyntheticWeb([site]) as net:
        settings = crawl_settings(
            net,
            tmp_path,
            render=True,
            delay=delay,
            concurrency_per_domain=1,
            scope=Scope(domains=("a.test",), max_depth=0),
        )
        await Crawl(settings).run([net.url("a.test", "/")])
    records = records_by_path(tmp_path)
    assert records[""]["links"] == 1, records  # the fetch() answer was rendered
    hits = net.hits_for("a.test")
    paths = sorted(h.path for h in hits)
    assert paths == sorted(
        ["/robots.txt", "/", "/data.js", "/data.json"] + [f"/s{n}.js" for n in range(4)]
    )
    assert net.peak_concurrency("a.test") == 1
    if delay:
        gaps = [later.at - earlier.at for earlier, later in itertools.pairwise(hits)]
        assert min(gaps) > delay - 0.05, gaps  # arrivals: a busy server notes one ms late
    only_crawlq_sent(net)


async def test_a_hosts_long_interval_delays_a_pages_scripts_and_does_not_drop_them(
    tmp_path: Path,
) -> None:
    """An interval longer than a request may wait for its turn (a page would be put back in
    the queue): the page's script waits for its host's turn in the render, and goes then.
    (robots.txt is off: a page paced after its host's robots.txt by an interval over
    MAX_PACING_WAIT is put back for ever, which is Politeness's own matter.)"""
    routes = {
        "/": page("slow", '<script src="/app.js"></script>'),
        "/app.js": respond(body=insert("<a id=late href=/page/1>1</a>"), content_type=JS),
    }
    async with SyntheticWeb([Site(name="a.test", routes=routes)]) as net:
        stats, rendered = await render_in_a_task(
            tmp_path,
            fetch_settings(net, robots=False),
            net.url("a.test", "/"),
            wait_for="#late",
            limit={"concurrency": 1, "interval": 4.0},
        )
    assert stats.done == 1 and 'id="late"' in str(rendered[0].html)
    first, second = net.hits_for("a.test")
    assert (first.path, second.path) == ("/", "/app.js")
    assert second.at - first.at > 3.9


async def test_a_429_to_a_pages_script_pauses_its_host_and_the_page_is_rendered_again_after(
    tmp_path: Path,
) -> None:
    """The page's host answers its script 429 Retry-After 1 (the first time): the render is
    Throttled as the page would be, its host paused for a second in the queue, and nothing
    goes to the host before the second is over; then the page is fetched and rendered again,
    whole."""
    answered: list[int] = []

    async def script(request: web.Request) -> web.StreamResponse:
        if not answered:
            answered.append(429)
            return web.Response(status=429, headers={"Retry-After": "1"})
        answered.append(200)
        return web.Response(text=insert('<a href="/page/1">1</a>'), content_type=JS)

    routes = {"/": page("paused", '<script src="/app.js"></script>'), "/app.js": script}
    async with SyntheticWeb([Site(name="a.test", pages=2, routes=routes)]) as net:
        settings = crawl_settings(net, tmp_path, render=True, scope=Scope(max_depth=0))
        stats = await Crawl(settings).run([net.url("a.test", "/")])
    tries = read_records(tmp_path / PAGES_FILE)
    assert [(r["error"], r["retry"]) for r in tries] == [(Reason.THROTTLED, True), (None, False)]
    assert tries[0]["status"] == 200 and tries[0]["warc"] is not None  # the document, kept
    assert tries[1]["rendered"] and tries[1]["links"] == 1 and stats.done == 1
    hits = net.hits_for("a.test")
    assert [(h.path, h.status) for h in hits] == [
        ("/robots.txt", 404),
        ("/", 200),
        ("/app.js", 429),
        ("/", 200),
        ("/app.js", 200),
    ]
    paused = hits[2].ended
    assert paused is not None and hits[3].at - paused > 0.9  # Retry-After: 1 s


async def test_fetch_calls_out_of_scope_or_to_refused_addresses_are_never_sent(
    tmp_path: Path,
) -> None:
    """The page's script asks another site (out of the task's scope), a link-local address,
    and a name that resolves to a private address; crawlq refuses each before sending it.
    Without the scope, the other site is reached (through crawlq): the scope did it."""
    async with SyntheticWeb([Site(name="in.test"), Site(name="out.test")]) as net:
        targets = [
            net.url("out.test", "/secret"),
            "http://169.254.169.254/latest/meta-data/",
            "http://internal.test/admin",
        ]
        calls = ", ".join(f"fetch({json.dumps(t)})" for t in targets)
        script = (
            f"Promise.allSettled([{calls}]).then(rs => document.body.insertAdjacentHTML("
            "'beforeend', '<p id=done>' + rs.map(r => r.status).join(' ') + '</p>'));"
        )
        net.sites["in.test"].routes["/"] = page("fetches", f"<script>{script}</script>")
        resolve = net.resolve | {"internal.test": "10.1.2.3"}
        settings = fetch_settings(net, resolve=resolve)
        results: dict[str, Rendered] = {}
        app = App(f"sqlite:///{tmp_path / 'q.db'}")
        app.provide("crawlq.fetcher", lambda: Fetcher(settings))
        scope = Scope(domains=("in.test",))

        @app.task(retry=Retry(max_attempts=1))
        async def visit(ctx: Context, url: str) -> None:
            results["scoped"] = await ctx.render(url, scope=scope.check, wait_for="#done")
            results["any"] = await ctx.render(url, wait_for="#done")

        await app.aschedule(visit, net.url("in.test", "/"))
        stats = await Worker(app, burst=True).run()
        await app.aclose()
    assert stats.done == 1
    scoped = {r.url: r.error for r in results["scoped"].resources if r.kind == "fetch"}
    assert scoped == {
        targets[0]: Reason.OUT_OF_SCOPE,
        targets[1]: Reason.OUT_OF_SCOPE,
        targets[2]: Reason.OUT_OF_SCOPE,
    }
    anywhere = {r.url: r.error or r.status for r in results["any"].resources if r.kind == "fetch"}
    assert anywhere == {
        targets[0]: "cors",  # reached, but its answer lets no other origin read it
        targets[1]: Reason.BLOCKED,
        targets[2]: Reason.BLOCKED,
    }
    # out.test was asked once: by the render without the scope, for its robots.txt first.
    assert [h.path for h in net.hits_for("out.test")] == ["/robots.txt", "/secret"]
    # The page saw the refusals, and the answer it may not read, as network errors.
    assert '<p id="done">rejected rejected rejected</p>' in str(results["scoped"].html)
    assert '<p id="done">rejected rejected rejected</p>' in str(results["any"].html)
    only_crawlq_sent(net)


class Datagrams(asyncio.DatagramProtocol):
    """A UDP port that notes every datagram it gets."""

    def __init__(self) -> None:
        self.received: list[bytes] = []

    def datagram_received(self, data: bytes, addr: tuple[str | Any, int]) -> None:
        self.received.append(data)


async def test_webrtc_sends_no_packet_past_the_guard(tmp_path: Path) -> None:
    """WebRTC's ICE gathering sends STUN over UDP from Chromium itself, past the interception
    and the proxy that leads nowhere: a page asks for a STUN server at an address the guard
    refuses (a loopback one outside the allowed network), and gathering ends with nothing
    received there (the page waits for gathering to complete)."""
    loop = asyncio.get_running_loop()
    transport, udp = await loop.create_datagram_endpoint(Datagrams, local_addr=("127.0.3.9", 0))
    stun = "stun:127.0.3.9:{}".format(transport.get_extra_info("sockname")[1])
    script = (
        f"const pc = new RTCPeerConnection({{iceServers: [{{urls: {json.dumps(stun)}}}]}});"
        "pc.createDataChannel('x');"
        "pc.onicegatheringstatechange = () => { if (pc.iceGatheringState === 'complete') "
        + insert("<p id=done>gathered</p>")
        + " };"
        "pc.createOffer().then(offer => pc.setLocalDescription(offer));"
    )
    routes = {"/": page("webrtc", f"<script>{script}</script>")}
    try:
        async with SyntheticWeb([Site(name="a.test", routes=routes)]) as net:
            allow = (f"{net.addresses['a.test']}/32",)
            stats, rendered = await render_in_a_task(
                tmp_path,
                fetch_settings(net, allow_networks=allow),
                net.url("a.test", "/"),
                wait_for="#done",
            )
    finally:
        transport.close()
    assert udp.received == []
    assert stats.done == 1 and 'id="done"' in str(rendered[0].html)


async def test_requests_beyond_max_requests_are_aborted_even_while_the_first_are_in_flight(
    tmp_path: Path,
) -> None:
    """The page asks ten hosts at once (one at a time per host: these all go together) and
    none of them answers until the test is over: with max_requests=3 the document and two of
    them are requests of the page, and the other eight fail at once (aborted by crawlq, or,
    once it stopped routing them, in Chromium), rather than sent because no request had been
    answered yet."""
    release = asyncio.Event()
    sites = [Site(name=f"b{n}.test", routes={"/": hang(release)}) for n in range(10)]
    async with SyntheticWeb([Site(name="a.test"), *sites]) as net:
        calls = "".join(
            f"fetch({json.dumps(net.url(site.name, '/'))}).catch(failed);" for site in sites
        )
        script = (
            "let refused = 0;"
            "function failed() { if (++refused === 8) "
            + insert("<p id=done>done</p>")
            + " }"
            + calls
        )
        net.sites["a.test"].routes["/"] = page("many", f"<script>{script}</script>")
        async with Fetcher(fetch_settings(net, robots=False)) as fetcher:
            document = await fetcher.fetch(net.url("a.test", "/"))
            fetch = direct(fetcher)

            settings = BrowserSettings(max_requests=3, timeout=20, wait_until="load")
            try:
                async with Browser(settings) as browser:
                    rendered = await browser.render(document, fetch, wait_for="#done")
            finally:
                release.set()
    skipped = [r for r in rendered.resources if r.error == "skipped"]
    assert skipped and {r.detail for r in skipped} == {"over 3 requests"}
    sent = [h.host for h in net.hits if h.host != "a.test"]  # the render may end first
    assert len(sent) <= 2, sent


async def test_past_max_requests_the_pages_requests_no_longer_reach_crawlq(
    tmp_path: Path,
) -> None:
    """Past max_requests a page's requests fail in Chromium, at the proxy that leads nowhere,
    rather than each being routed to crawlq to be aborted there (a page asking thousands a
    second kept the worker's loop busy and its memory growing far past the timeout). The
    page asks one request at a time: the third is over the cap, and those after it are never
    seen by crawlq, though the page saw each fail."""
    script = (
        "(async () => { for (let n = 0; n < 6; n++) await fetch('/page/' + n).catch(() => {});"
        + insert("<p id=done>done</p>")
        + "})();"
    )
    routes = {"/": page("capped", f"<script>{script}</script>")}
    async with (
        SyntheticWeb([Site(name="a.test", pages=6, routes=routes)]) as net,
        Fetcher(fetch_settings(net)) as fetcher,
    ):
        document = await fetcher.fetch(net.url("a.test", "/"))
        settings = BrowserSettings(max_requests=3, wait_until="load")
        async with Browser(settings) as browser:
            rendered = await browser.render(document, direct(fetcher), wait_for="#done")
    seen = [(r.url.split("/", 3)[3], r.status or r.error) for r in rendered.resources]
    assert seen == [("", 200), ("page/0", 200), ("page/1", 200), ("page/2", "skipped")]
    assert sorted(h.path for h in net.hits) == ["/", "/page/0", "/page/1", "/robots.txt"]


async def test_a_pages_requests_carry_the_sessions_cookies_and_those_its_scripts_set(
    tmp_path: Path,
) -> None:
    """The document's Set-Cookie went into crawlq's session (and to Chromium); a cookie a
    script sets goes along with it on the page's fetch(), sent by crawlq."""
    script = (
        "document.cookie = 'js=set-by-script; path=/';"
        "fetch('/data.json').then(() => " + insert("<p id=done>done</p>")[:-1] + ");"
    )
    routes = {
        "/": respond(
            body=page_html("cookies", [], f"<script>{script}</script>"),
            headers={"Set-Cookie": "session=from-server; Path=/"},
        ),
        "/data.json": respond(body="[]", content_type="application/json"),
    }
    async with SyntheticWeb([Site(name="a.test", routes=routes)]) as net:
        stats, _ = await render_in_a_task(
            tmp_path, fetch_settings(net), net.url("a.test", "/"), wait_for="#done"
        )
    assert stats.done == 1
    (data,) = [h for h in net.hits if h.path == "/data.json"]
    assert data.cookies == {"session": "from-server", "js": "set-by-script"}
    only_crawlq_sent(net)


async def test_a_redirected_script_is_fetched_once_per_hop_and_runs_from_where_it_led(
    tmp_path: Path,
) -> None:
    """crawlq follows the redirect itself (each hop checked) and answers Chromium with where
    it led: each hop requested once, by crawlq (a redirect answer would have Chromium send
    the next hop itself, past the interception)."""
    script = insert("<a id=ran href=/page/1>ran</a>")
    routes = {
        "/": page("moved", '<script src="/old.js"></script>'),
        "/old.js": redirect("/static/new.js", status=301),
        "/static/new.js": respond(body=script, content_type=JS),
    }
    async with SyntheticWeb([Site(name="a.test", routes=routes)]) as net:
        stats, rendered = await render_in_a_task(
            tmp_path, fetch_settings(net), net.url("a.test", "/"), wait_for="#ran"
        )
    assert stats.done == 1
    assert sorted(h.path for h in net.hits) == ["/", "/old.js", "/robots.txt", "/static/new.js"]
    scripts = [(r.url.split("/", 3)[3], r.status) for r in rendered[0].resources[1:]]
    assert scripts == [("old.js", 200)]
    only_crawlq_sent(net)


async def test_a_rendered_dom_over_the_size_cap_is_too_large_as_a_body_would_be(
    tmp_path: Path,
) -> None:
    grow = "document.body.insertAdjacentHTML('beforeend', '<p>' + 'x'.repeat(50000) + '</p>');"
    routes = {"/": page("big", f"<script>{grow}</script>")}
    async with SyntheticWeb([Site(name="a.test", routes=routes)]) as net:
        fetch = fetch_settings(net, max_bytes=20_000)
        settings = crawl_settings(net, tmp_path, render=True, fetch=fetch)
        await Crawl(settings).run([net.url("a.test", "/")])
    (record,) = read_records(tmp_path / PAGES_FILE)
    assert record["error"] == Reason.TOO_LARGE and not record["retry"]
    assert record["detail"] == "rendered DOM over 20000 bytes"


async def test_an_html_attachment_is_rendered_and_an_empty_answer_is_not_a_browser_failure(
    tmp_path: Path,
) -> None:
    """HTML sent as an attachment would be a download to Chromium ("Download is starting"),
    and a 204/205 leaves it where it was: neither is Chromium's failure (which is retried).
    The attachment is rendered as the page it is; the empty answers are returned unrendered."""
    attached = page_html("attached", [], f"<script>{insert('<p id=ran>ran</p>')}</script>")
    routes = {
        "/attached": respond(
            body=attached, headers={"Content-Disposition": "attachment; filename=page.html"}
        ),
        "/204": respond(204),
        "/205": respond(205),
    }
    results: dict[str, Rendered] = {}
    async with SyntheticWeb([Site(name="a.test", routes=routes)]) as net:
        app = App(f"sqlite:///{tmp_path / 'q.db'}")
        app.provide("crawlq.fetcher", lambda: Fetcher(fetch_settings(net)))

        @app.task(retry=Retry(max_attempts=1))
        async def visit(ctx: Context, url: str) -> None:
            for path in routes:
                results[path] = await ctx.render(net.url("a.test", path))

        await app.aschedule(visit, net.url("a.test", "/"))
        stats = await Worker(app, burst=True).run()
        await app.aclose()
    assert stats.done == 1, results
    assert '<p id="ran">ran</p>' in str(results["/attached"].html)
    assert results["/204"].html is None and results["/205"].html is None
    assert results["/204"].response.status == 204


async def test_a_rendered_dom_over_the_size_cap_is_never_sent_to_crawlq(tmp_path: Path) -> None:
    """A few bytes of script build a DOM of 30 million characters (and make `outerHTML` lie
    in the page's own world): with a 1 MiB cap the render is TOO_LARGE, and the DOM was never
    serialized into crawlq's memory (traced: far under the DOM's size)."""
    grow = (
        "document.body.insertAdjacentHTML('beforeend', '<p>' + 'x'.repeat(30000000) + '</p>');"
        "Object.defineProperty(Element.prototype, 'outerHTML', {get() { return ''; }});"
    )
    routes = {"/": page("huge", f"<script>{grow}</script>")}
    async with (
        SyntheticWeb([Site(name="a.test", routes=routes)]) as net,
        Fetcher(fetch_settings(net)) as fetcher,
    ):
        document = await fetcher.fetch(net.url("a.test", "/"))
        fetch = direct(fetcher)

        async with Browser(BrowserSettings(timeout=60)) as browser:
            tracemalloc.start()
            try:
                with pytest.raises(FetchError) as failed:
                    await browser.render(document, fetch, max_bytes=2**20)
                _, peak = tracemalloc.get_traced_memory()
            finally:
                tracemalloc.stop()
    assert failed.value.reason is Reason.TOO_LARGE
    assert failed.value.detail == f"rendered DOM over {2**20} bytes"
    assert peak < 10 * 2**20, peak


async def test_a_missing_chromium_is_an_error_in_the_page_record_and_the_crawl_goes_on(
    tmp_path: Path,
) -> None:
    missing = str(tmp_path / "no-chromium")
    async with SyntheticWeb([Site(name="a.test", pages=3)]) as net:
        settings = crawl_settings(
            net, tmp_path, render=True, browser=BrowserSettings(executable=missing)
        )
        stats = await Crawl(settings).run(
            [net.url("a.test", "/page/0"), net.url("a.test", "/page/2")]
        )
    records = records_by_path(tmp_path)
    assert sorted(records) == ["page/0", "page/2"] and stats.done == 2 and stats.failed == 0
    for record in records.values():
        assert record["error"] == Reason.BROWSER_UNAVAILABLE and not record["retry"]
        assert f"no Chromium at {missing}" in str(record["detail"])
        assert record["status"] == 200 and record["warc"] is not None  # the document is kept
        assert record["links"] == 0 and not record["rendered"]


def chromium_processes() -> list[psutil.Process]:
    """The Chromium browser processes crawlq started in this test process (found by the
    resolver rule it launches them with; not the renderers and helpers, which go with it,
    nor a dashboard test's Chromium)."""
    found = []
    for process in psutil.Process().children(recursive=True):
        with contextlib.suppress(psutil.Error):
            command = process.cmdline()
            main = command and not any(arg.startswith("--type=") for arg in command)
            if main and "--host-resolver-rules=MAP * ~NOTFOUND" in command:
                found.append(process)
    return found


def kill_chromium() -> int:
    """SIGKILLs the Chromium browser processes crawlq started in this test process; returns
    how many."""
    killed = 0
    for process in chromium_processes():
        with contextlib.suppress(psutil.Error):
            process.kill()
            killed += 1
    return killed


async def test_chromium_killed_mid_render_fails_the_page_alone_and_the_retry_renders_it(
    tmp_path: Path,
) -> None:
    """The server kills Chromium while answering the page's script (the first time): that
    page's render fails as browser_failed and is retried; the retry launches a new Chromium
    and renders the page; the worker never stops."""
    killed: list[int] = []

    async def script(request: web.Request) -> web.StreamResponse:
        if not killed:
            killed.append(kill_chromium())
        return web.Response(text=insert('<a href="/page/1">1</a>'), content_type=JS)

    routes = {"/": page("crash", '<script src="/app.js"></script>'), "/app.js": script}
    async with SyntheticWeb([Site(name="a.test", pages=2, routes=routes)]) as net:
        settings = crawl_settings(net, tmp_path, render=True, scope=Scope(max_depth=0))
        stats = await Crawl(settings).run([net.url("a.test", "/")])
    assert killed == [1]
    tries = read_records(tmp_path / PAGES_FILE)
    assert [(r["error"], r["retry"]) for r in tries] == [
        (Reason.BROWSER_FAILED, True),
        (None, False),
    ]
    assert tries[1]["rendered"] and tries[1]["links"] == 1
    assert stats.done == 1 and stats.dead == 0


async def test_a_hung_chromium_fails_the_render_and_is_replaced_not_kept(tmp_path: Path) -> None:
    """The server stops Chromium (SIGSTOP) while answering the page's script: it is still
    connected but never answers again. The render fails as browser_failed (retried), the
    hung Chromium is killed, and the next render launches a new one; closing never hangs."""
    stopped: list[psutil.Process] = []

    async def script(request: web.Request) -> web.StreamResponse:
        if not stopped:
            stopped.extend(chromium_processes())
            for process in stopped:
                process.suspend()
        return web.Response(text=insert("<p id=ran>ran</p>"), content_type=JS)

    routes = {"/": page("hung", '<script src="/app.js"></script>'), "/app.js": script}
    try:
        async with (
            SyntheticWeb([Site(name="a.test", routes=routes)]) as net,
            Fetcher(fetch_settings(net)) as fetcher,
        ):
            document = await fetcher.fetch(net.url("a.test", "/"))
            fetch = direct(fetcher)

            async with Browser(BrowserSettings(timeout=4)) as browser:
                with pytest.raises(FetchError) as failed:
                    await browser.render(document, fetch)
                again = await browser.render(document, fetch, wait_for="#ran")
                launches = browser.launches
                hung_left = [p.pid for p in stopped if p.is_running()]  # not killed: leaked
    finally:
        for process in stopped:
            with contextlib.suppress(psutil.Error):
                process.kill()
    assert len(stopped) == 1
    assert failed.value.reason is Reason.BROWSER_FAILED and failed.value.transient
    assert "stopped answering" in failed.value.detail
    assert 'id="ran"' in str(again.html) and launches == 2 and hung_left == []


async def test_a_browser_that_cannot_start_is_an_error_of_the_render_not_of_the_worker(
    tmp_path: Path,
) -> None:
    not_chromium = tmp_path / "not-chromium"
    not_chromium.write_text("#!/bin/sh\nexit 3\n")
    not_chromium.chmod(0o755)
    async with SyntheticWeb([Site(name="a.test")]) as net, Fetcher(fetch_settings(net)) as fetcher:
        document = await fetcher.fetch(net.url("a.test"))
        async with Browser(BrowserSettings(executable=str(not_chromium), timeout=10)) as browser:

            async def never(*_: Any) -> Any:
                raise AssertionError("nothing is fetched without a browser")

            with pytest.raises(FetchError) as failed:
                await browser.render(document, never)
    assert failed.value.reason is Reason.BROWSER_UNAVAILABLE
    assert "did not start" in failed.value.detail


def test_render_without_playwright_is_a_config_error_naming_the_extra(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "playwright.async_api", None)  # import fails
    with pytest.raises(ConfigError, match=r"crawlq\[browser\]"):
        Crawl(crawl_settings(SyntheticWeb([]), tmp_path, render=True))
