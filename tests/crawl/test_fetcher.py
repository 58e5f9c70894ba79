"""The fetcher against real local servers: redirects, robots, errors, compression,
charsets, proxies, logins."""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import gzip
import resource
import socket
import time
from collections.abc import AsyncIterator
from http.cookies import SimpleCookie
from pathlib import Path

import brotli
import pytest
from aiohttp import web
from yarl import URL

from crawlq.backends import open_backend
from crawlq.crawl import fetcher as fetcher_module
from crawlq.crawl import politeness as politeness_module
from crawlq.crawl.errors import FetchError, Reason, Throttled
from crawlq.crawl.fetcher import Fetcher, Login, Session
from crawlq.crawl.politeness import Backoff, Politeness
from crawlq.crawl.scope import Scope
from crawlq.crawl.settings import FetchSettings, Timeouts
from crawlq.crawl.testing import ForwardProxy, Site, SyntheticWeb, hang, redirect, respond
from crawlq.types import Limit, LimitRule

from .conftest import fetch_settings


@pytest.fixture
async def net() -> AsyncIterator[SyntheticWeb]:
    sites = [
        Site(name="a.test", pages=5, robots="User-agent: *\nDisallow: /private\n"),
        Site(name="b.test", pages=5),
    ]
    async with SyntheticWeb(sites) as web_:
        yield web_


def paths(net: SyntheticWeb, host: str) -> list[str]:
    return [hit.path for hit in net.hits_for(host)]


async def test_redirects_are_followed_hop_by_hop_and_kept_in_the_history(
    net: SyntheticWeb,
) -> None:
    site = net.sites["a.test"]
    site.routes["/r1"] = redirect("/r2", 301)
    site.routes["/r2"] = redirect(net.url("a.test", "/page/3"), 302)
    async with Fetcher(fetch_settings(net)) as fetcher:
        response = await fetcher.fetch(net.url("a.test", "/r1"))
    assert response.status == 200
    assert response.url == net.url("a.test", "/page/3")
    assert [(h.url, h.status) for h in response.history] == [
        (net.url("a.test", "/r1"), 301),
        (net.url("a.test", "/r2"), 302),
    ]
    assert paths(net, "a.test") == ["/robots.txt", "/r1", "/r2", "/page/3"]


async def test_a_redirect_loop_stops_with_its_hops_and_no_extra_request(net: SyntheticWeb) -> None:
    site = net.sites["a.test"]
    site.routes["/loop/a"] = redirect("/loop/b")
    site.routes["/loop/b"] = redirect("/loop/a")
    async with Fetcher(fetch_settings(net)) as fetcher:
        with pytest.raises(FetchError) as caught:
            await fetcher.fetch(net.url("a.test", "/loop/a"))
    assert caught.value.reason is Reason.REDIRECT_LOOP
    assert [r.status for r in caught.value.responses] == [302, 302]
    assert paths(net, "a.test") == ["/robots.txt", "/loop/a", "/loop/b"]


async def test_a_redirect_to_the_same_url_with_a_new_cookie_is_followed(
    net: SyntheticWeb,
) -> None:
    """A site that sets a cookie and sends the browser back to the same page: it was taken
    for a loop at once, though browsers, curl and Scrapy all get the page."""

    async def cookie_gate(request: web.Request) -> web.StreamResponse:
        if request.cookies.get("visited") == "1":
            return web.Response(text="<title>in</title>", content_type="text/html")
        answer = web.Response(status=302, headers={"Location": "/gate"})
        answer.set_cookie("visited", "1")
        return answer

    net.sites["a.test"].routes["/gate"] = cookie_gate
    net.sites["a.test"].routes["/again"] = redirect("/again")
    async with Fetcher(fetch_settings(net)) as fetcher:
        response = await fetcher.fetch(net.url("a.test", "/gate"))
        with pytest.raises(FetchError) as caught:
            await fetcher.fetch(net.url("a.test", "/again"))
    assert response.status == 200 and [h.status for h in response.history] == [302]
    assert caught.value.reason is Reason.REDIRECT_LOOP  # no new cookie: a loop, as before
    assert paths(net, "a.test") == ["/robots.txt", "/gate", "/gate", "/again"]


async def test_credentials_stay_with_their_origin_across_redirects(net: SyntheticWeb) -> None:
    """The caller's Authorization, Cookie and Proxy-Authorization, headers named as secrets
    (X-Api-Key), and a login hook's token on its session, go to the first URL's origin (and
    the login domain) only: not to the host a redirect leads to, nor back from it. Other
    headers go with every hop."""
    site = net.sites["a.test"]
    site.routes["/api"] = redirect("/same")
    site.routes["/same"] = redirect(net.url("b.test", "/elsewhere"))
    net.sites["b.test"].routes["/elsewhere"] = redirect(net.url("a.test", "/back"))
    secrets = {
        "Authorization": "Bearer T",
        "Cookie": "sid=S",
        "Proxy-Authorization": "Basic P",
        "X-Api-Key": "K",
        "X-Session-Token": "ST",
    }

    async def sign_in(session: Session) -> None:
        session.client.headers["Authorization"] = "Bearer LOGIN"
        session.client.headers["X-Auth-Token"] = "LOGIN-T"

    async with Fetcher(fetch_settings(net)) as fetcher:
        response = await fetcher.fetch(
            net.url("a.test", "/api"), headers={**secrets, "X-Trace": "t1"}
        )
        fetcher.add_login("a.test", Login(perform=sign_in))
        await fetcher.fetch(net.url("a.test", "/api"))
    assert response.url == net.url("a.test", "/back")

    def sent(hit_path: str) -> list[dict[str, str | None]]:
        names = (*secrets, "X-Auth-Token")
        hits = [hit for hit in net.hits if hit.path == hit_path]
        return [{name: hit.headers.get(name) for name in names} for hit in hits]

    nothing = dict.fromkeys((*secrets, "X-Auth-Token"))
    signed_in = {**nothing, "Authorization": "Bearer LOGIN", "X-Auth-Token": "LOGIN-T"}
    assert sent("/api") == [{**nothing, **secrets}, signed_in]
    assert sent("/same") == [{**nothing, **secrets}, signed_in]
    assert sent("/elsewhere") == [nothing, nothing]
    assert sent("/back") == [nothing, nothing]
    traced = [hit.headers.get("X-Trace") for hit in net.hits if hit.path != "/robots.txt"]
    assert traced == ["t1"] * 4 + [None] * 4


@pytest.mark.parametrize(
    ("first", "hop", "domain", "trusted"),
    [
        ("http://a.test/x", "http://a.test:80/y", "", True),
        ("http://a.test/x", "http://a.test:81/y", "", False),
        ("http://a.test/x", "https://a.test/y", "", False),
        ("http://a.test/x", "http://b.a.test/y", "", False),
        ("http://a.test/x", "http://b.a.test/y", "a.test", True),
        ("http://b.a.test/x", "https://a.test/y", "a.test", True),
        ("https://a.test/x", "http://a.test/y", "a.test", False),  # from https to http
        ("http://a.test/x", "http://xa.test/y", "a.test", False),
        ("http://a.test/x", "http://b.test/y", "a.test", False),
    ],
)
def test_which_hops_credentials_may_go_to(first: str, hop: str, domain: str, trusted: bool) -> None:
    session = Session(Fetcher(), None, None, domain)  # type: ignore[arg-type]
    assert fetcher_module._trusted(session, URL(first), URL(hop)) is trusted


async def test_a_host_named_by_its_address_keeps_its_cookies() -> None:
    """A login on an intranet address works: aiohttp's jar drops such cookies by default."""

    async def handle(request: web.Request) -> web.StreamResponse:
        answer = web.Response(text=request.headers.get("Cookie", "none"))
        if request.path == "/set":
            answer.set_cookie("sid", "1")
        return answer

    app = web.Application()
    app.router.add_get("/{path:.*}", handle)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.5", 0)
    await site.start()
    port = runner.addresses[0][1]
    await web.TCPSite(runner, "127.0.0.6", port).start()  # another host, the same server
    settings = FetchSettings(resolve_only=True, allow_networks=("127.0.0.0/8",), robots=False)
    try:
        async with Fetcher(settings) as fetcher:
            await fetcher.fetch(f"http://127.0.0.5:{port}/set")
            same = await fetcher.fetch(f"http://127.0.0.5:{port}/show")
            other = await fetcher.fetch(f"http://127.0.0.6:{port}/show")
    finally:
        await runner.cleanup()
    assert (same.text(), other.text()) == ("sid=1", "none")


async def test_a_redirect_turns_a_post_into_a_get_without_its_body_and_keeps_a_head(
    net: SyntheticWeb,
) -> None:
    site = net.sites["a.test"]
    site.routes["/form"] = redirect("/done", 302)
    site.routes["/see"] = redirect("/page/1", 303)
    async with Fetcher(fetch_settings(net)) as fetcher:
        posted = await fetcher.fetch(
            net.url("a.test", "/form"),
            method="POST",
            data=b'{"password": "pw"}',
            headers={"Content-Type": "application/json", "X-Kept": "1"},
        )
        head = await fetcher.fetch(net.url("a.test", "/see"), method="HEAD")
    assert (posted.status, head.status, head.body) == (404, 200, b"")
    sent = [(h.method, h.path, h.headers.get("Content-Type"), h.headers.get("X-Kept"))
            for h in net.hits_for("a.test") if h.path != "/robots.txt"]  # fmt: skip
    assert sent == [
        ("POST", "/form", "application/json", "1"),
        ("GET", "/done", None, "1"),
        ("HEAD", "/see", None, None),
        ("HEAD", "/page/1", None, None),
    ]


async def test_the_most_specific_login_domain_signs_in_its_hosts() -> None:
    async def shop(session: Session) -> None:
        pass

    async def parent(session: Session) -> None:
        pass

    async with Fetcher() as fetcher:
        fetcher.add_login("b.test", Login(perform=parent))
        fetcher.add_login("shop.b.test", Login(perform=shop))
        logins = {
            host: fetcher.session(f"http://{host}/").login
            for host in ("b.test", "www.b.test", "shop.b.test", "cart.shop.b.test", "c.test")
        }
    assert {host: login and login.perform for host, login in logins.items()} == {
        "b.test": parent,
        "www.b.test": parent,
        "shop.b.test": shop,
        "cart.shop.b.test": shop,
        "c.test": None,
    }


async def test_a_site_cannot_set_a_cookie_for_a_public_suffix(net: SyntheticWeb) -> None:
    """Domain=test (or com, co.uk) would reach every other site through the shared session."""

    async def plant(request: web.Request) -> web.StreamResponse:
        answer = web.Response(text="planted")
        answer.headers.add("Set-Cookie", "tld=1; Domain=test; Path=/")
        answer.headers.add("Set-Cookie", "psl=1; Domain=co.uk; Path=/")
        answer.headers.add("Set-Cookie", "twice=1; Domain=a.test; Domain=test")  # the last counts
        answer.headers.add("Set-Cookie", 'quoted="x; domain=a.test"; Domain=test')
        answer.headers.add("Set-Cookie", "mine=1; Domain=a.test; Path=/")
        answer.headers.add("Set-Cookie", "own=1; Path=/")
        return answer

    net.sites["a.test"].routes["/plant"] = plant
    async with Fetcher(fetch_settings(net)) as fetcher:
        await fetcher.fetch(net.url("a.test", "/plant"))
        await fetcher.fetch(net.url("a.test", "/page/1"))
        await fetcher.fetch(net.url("b.test", "/page/1"))
        fetcher.session("http://x/").client.cookie_jar.update_cookies(
            SimpleCookie("api=1; Domain=com"), URL("http://example.com/")
        )
        kept = {cookie.key for cookie in fetcher.session("http://x/").client.cookie_jar}
    (a_page,) = [h for h in net.hits_for("a.test") if h.path == "/page/1"]
    (b_page,) = [h for h in net.hits_for("b.test") if h.path == "/page/1"]
    assert (a_page.cookies, b_page.cookies) == ({"mine": "1", "own": "1"}, {})
    assert kept == {"mine", "own"}


async def test_a_utf8_location_is_read_as_utf8(net: SyntheticWeb) -> None:
    """Headers are kept as Latin-1: /café, sent as UTF-8 bytes, was requested as
    /caf%C3%83%C2%A9."""
    net.sites["a.test"].routes["/old"] = redirect("/café")
    net.sites["a.test"].routes["/café"] = respond(200, "<title>café</title>")
    async with Fetcher(fetch_settings(net)) as fetcher:
        response = await fetcher.fetch(net.url("a.test", "/old"))
    assert response.status == 200
    assert response.url == net.url("a.test", "/caf%C3%A9")
    assert paths(net, "a.test")[-1] == "/caf%C3%A9"


async def test_too_many_redirects(net: SyntheticWeb) -> None:
    site = net.sites["a.test"]
    for n in range(5):
        site.routes[f"/hop/{n}"] = redirect(f"/hop/{n + 1}")
    async with Fetcher(fetch_settings(net, max_redirects=2)) as fetcher:
        with pytest.raises(FetchError) as caught:
            await fetcher.fetch(net.url("a.test", "/hop/0"))
    assert caught.value.reason is Reason.TOO_MANY_REDIRECTS
    assert paths(net, "a.test") == ["/robots.txt", "/hop/0", "/hop/1", "/hop/2"]


async def test_each_hop_is_checked_against_scope_and_robots_before_it_is_requested(
    net: SyntheticWeb,
) -> None:
    site = net.sites["a.test"]
    site.routes["/to-b"] = redirect(net.url("b.test", "/page/1"))
    site.routes["/to-private"] = redirect("/private/1")
    scope = Scope(domains=("a.test",))

    async def check(url: str) -> None:
        scope.check(url)

    async with Fetcher(fetch_settings(net)) as fetcher:
        with pytest.raises(FetchError) as out_of_scope:
            await fetcher.fetch(net.url("a.test", "/to-b"), check=check)
        with pytest.raises(FetchError) as disallowed:
            await fetcher.fetch(net.url("a.test", "/to-private"), check=check)
        with pytest.raises(FetchError) as direct:
            await fetcher.fetch(net.url("a.test", "/private/2"))
    assert out_of_scope.value.reason is Reason.OUT_OF_SCOPE
    assert [r.status for r in out_of_scope.value.responses] == [302]
    assert disallowed.value.reason is Reason.ROBOTS_DISALLOWED
    assert direct.value.reason is Reason.ROBOTS_DISALLOWED
    assert net.hits_for("b.test") == []
    assert paths(net, "a.test") == ["/robots.txt", "/to-b", "/to-private"]


async def test_robots_txt_of_a_site_behind_a_password_is_asked_with_that_password(
    net: SyntheticWeb,
) -> None:
    """The rules are the host's, kept once for every user; the password is case-sensitive."""
    password = "Basic " + base64.b64encode(b"Ann:S3cRet").decode()

    async def members_only(request: web.Request) -> web.StreamResponse:
        if request.headers.get("Authorization") != password:
            return web.Response(status=401, headers={"WWW-Authenticate": "Basic"})
        if request.path == "/robots.txt":
            return web.Response(text="User-agent: *\nDisallow: /private\n")
        return web.Response(text="members")

    site = net.sites["b.test"]
    for path in ("/robots.txt", "/private", "/open"):
        site.routes[path] = members_only
    port = net.ports["b.test"]
    async with Fetcher(fetch_settings(net)) as fetcher:
        with pytest.raises(FetchError) as caught:
            await fetcher.fetch(f"http://Ann:S3cRet@b.test:{port}/private")
        opened = await fetcher.fetch(f"http://Ann:S3cRet@B.test:{port}/open")
        with pytest.raises(FetchError) as other_user:
            await fetcher.fetch(f"http://Bob:pw@b.test:{port}/private")
    assert caught.value.reason is other_user.value.reason is Reason.ROBOTS_DISALLOWED
    assert opened.text() == "members"
    assert paths(net, "b.test") == ["/robots.txt", "/open"]
    assert [hit.status for hit in net.hits_for("b.test")] == [200, 200]


async def test_robots_txt_is_fetched_once_per_host_even_by_concurrent_requests(
    net: SyntheticWeb,
) -> None:
    async with Fetcher(fetch_settings(net)) as fetcher:
        responses = await asyncio.gather(
            *(fetcher.fetch(url) for url in net.page_urls("a.test") + net.page_urls("b.test"))
        )
    assert [r.status for r in responses] == [200] * 10
    robots = [hit.host for hit in net.hits if hit.path == "/robots.txt"]
    assert sorted(robots) == ["a.test", "b.test"]


@pytest.mark.parametrize("coding", ["gzip", "br"])
async def test_compressed_bodies_are_decoded_and_kept_raw(net: SyntheticWeb, coding: str) -> None:
    html = "<html><head><title>zipped</title></head><body>" + "x" * 5000 + "</body></html>"
    packed = gzip.compress(html.encode()) if coding == "gzip" else brotli.compress(html.encode())
    net.sites["a.test"].routes["/z"] = respond(200, packed, headers={"Content-Encoding": coding})
    async with Fetcher(fetch_settings(net)) as fetcher:
        response = await fetcher.fetch(net.url("a.test", "/z"))
    assert response.raw == packed
    assert response.text() == html
    assert coding in net.hits_for("a.test")[-1].headers["Accept-Encoding"]


async def test_charsets_from_the_header_the_meta_tag_or_detection(net: SyntheticWeb) -> None:
    text = "Grüße aus Köln, déjà vu"
    site = net.sites["a.test"]
    site.routes["/latin1"] = respond(
        200, text.encode("latin-1"), content_type="text/html; charset=iso-8859-1"
    )
    meta = f'<html><head><meta charset="cp1252"></head><body>{text}</body></html>'
    site.routes["/meta"] = respond(200, meta.encode("cp1252"), content_type="text/html")
    site.routes["/bare-utf8"] = respond(200, text.encode(), content_type="text/html")
    async with Fetcher(fetch_settings(net)) as fetcher:
        latin1 = await fetcher.fetch(net.url("a.test", "/latin1"))
        by_meta = await fetcher.fetch(net.url("a.test", "/meta"))
        bare = await fetcher.fetch(net.url("a.test", "/bare-utf8"))
    assert latin1.text() == text
    assert text in by_meta.text()
    assert bare.text() == text


async def test_user_agent_is_sent(net: SyntheticWeb) -> None:
    async with Fetcher(fetch_settings(net, user_agent="testbot/2.0")) as fetcher:
        await fetcher.fetch(net.url("a.test", "/page/0"))
    assert {hit.headers["User-Agent"] for hit in net.hits} == {"testbot/2.0"}


# -- errors as data ---------------------------------------------------------------------


def closed_port() -> int:
    """A port nothing listens on (bound, then released)."""
    with socket.socket() as sock:
        sock.bind(("127.0.1.250", 0))
        return int(sock.getsockname()[1])


async def fetch_error(net: SyntheticWeb, url: str, **options: object) -> FetchError:
    async with Fetcher(fetch_settings(net, **options)) as fetcher:
        with pytest.raises(FetchError) as caught:
            await fetcher.fetch(url)
    return caught.value


async def test_dns_failure(net: SyntheticWeb) -> None:
    error = await fetch_error(net, "http://nowhere.test/page/0")
    assert error.reason is Reason.DNS
    assert error.transient


async def test_connection_refused(net: SyntheticWeb) -> None:
    port = closed_port()
    error = await fetch_error(
        net, f"http://gone.test:{port}/", resolve={**net.resolve, "gone.test": "127.0.1.250"}
    )
    assert error.reason is Reason.REFUSED


async def test_tls_error(net: SyntheticWeb) -> None:
    # The site speaks plain HTTP: the TLS handshake with it fails.
    url = net.url("a.test", "/page/0").replace("http://", "https://")
    error = await fetch_error(net, url)
    assert error.reason is Reason.TLS
    assert not error.transient


async def test_timeout(net: SyntheticWeb) -> None:
    release = asyncio.Event()
    net.sites["a.test"].routes["/slow"] = hang(release)
    try:
        async with Fetcher(fetch_settings(net, timeouts=Timeouts(read=1.0, total=5))) as fetcher:
            await fetcher.fetch(net.url("a.test", "/page/0"))  # robots.txt fetched in time
            with pytest.raises(FetchError) as caught:
                await fetcher.fetch(net.url("a.test", "/slow"))
    finally:
        release.set()
    assert caught.value.reason is Reason.TIMEOUT


async def test_too_large_by_header_by_stream_and_by_inflating(net: SyntheticWeb) -> None:
    site = net.sites["a.test"]
    site.routes["/big"] = respond(200, b"x" * 20_000)

    async def streamed(request: web.Request) -> web.StreamResponse:
        answer = web.StreamResponse()  # chunked: no Content-Length to refuse it early
        await answer.prepare(request)
        for _ in range(10):
            await answer.write(b"y" * 5_000)
        await answer.write_eof()
        return answer

    site.routes["/stream"] = streamed
    bomb = gzip.compress(b"z" * 1_000_000)
    site.routes["/bomb"] = respond(200, bomb, headers={"Content-Encoding": "gzip"})
    for path in ("/big", "/stream", "/bomb"):
        error = await fetch_error(net, net.url("a.test", path), max_bytes=10_000)
        assert error.reason is Reason.TOO_LARGE, path


async def test_bad_encoding(net: SyntheticWeb) -> None:
    site = net.sites["a.test"]
    site.routes["/bad"] = respond(200, b"<html>caf\xe9 \xff\xfe</html>")  # says utf-8
    site.routes["/corrupt-gzip"] = respond(
        200, b"not gzip at all", headers={"Content-Encoding": "gzip"}
    )
    async with Fetcher(fetch_settings(net)) as fetcher:
        response = await fetcher.fetch(net.url("a.test", "/bad"))
        with pytest.raises(FetchError) as bad_text:
            response.text()
        with pytest.raises(FetchError) as corrupt:
            await fetcher.fetch(net.url("a.test", "/corrupt-gzip"))
    assert bad_text.value.reason is Reason.BAD_ENCODING
    assert corrupt.value.reason is Reason.BAD_ENCODING


# -- proxies ----------------------------------------------------------------------------


async def test_every_request_goes_through_the_fixed_proxy(net: SyntheticWeb) -> None:
    async with (
        ForwardProxy(net.resolve) as proxy,
        Fetcher(fetch_settings(net, proxies=(proxy.url,))) as fetcher,
    ):
        urls = net.page_urls("a.test")[:3] + net.page_urls("b.test")[:2]
        responses = [await fetcher.fetch(url) for url in urls]
    assert [r.status for r in responses] == [200] * 5
    seen_by_servers = sorted(net.url(h.host, h.path) for h in net.hits)
    assert sorted(proxy.requests) == seen_by_servers
    assert len(seen_by_servers) == 7  # 5 pages and 2 robots.txt


async def test_a_rotating_set_of_proxies_shares_the_requests(net: SyntheticWeb) -> None:
    async with ForwardProxy(net.resolve) as one, ForwardProxy(net.resolve) as two:
        settings = fetch_settings(net, proxies=(one.url, two.url))
        async with Fetcher(settings) as fetcher:
            for url in net.page_urls("a.test"):
                await fetcher.fetch(url)
    assert len(one.requests) == len(two.requests) == 3  # robots.txt and 5 pages, alternating
    assert sorted(one.requests + two.requests) == sorted(net.url(h.host, h.path) for h in net.hits)


async def test_a_proxy_that_cannot_be_reached_is_left_out_not_blamed_on_the_sites(
    net: SyntheticWeb, tmp_path: Path
) -> None:
    dead = f"http://127.0.1.250:{closed_port()}"
    backend = open_backend(f"sqlite:///{tmp_path / 'queue.db'}")
    await backend.open()
    politeness = Politeness(backend)
    try:
        async with ForwardProxy(net.resolve) as live:
            settings = fetch_settings(net, proxies=(dead, live.url))
            async with Fetcher(settings) as fetcher:
                answers = [await fetcher.fetch(url) for url in net.page_urls("a.test")]
            assert [r.status for r in answers] == [200] * 5
            assert len(live.requests) == 6  # robots.txt and 5 pages: the dead one left out
            settings = fetch_settings(net, proxies=(dead,) * 4)
            async with Fetcher(settings) as fetcher:
                with pytest.raises(FetchError) as caught:
                    await politeness.fetch(fetcher, net.url("b.test", "/page/1"))
            async with Fetcher(fetch_settings(net, proxies=(dead,))) as fetcher:
                with pytest.raises(FetchError) as alone:
                    await politeness.fetch(fetcher, net.url("a.test", "/page/2"))
    finally:
        await backend.close()
    assert caught.value.reason is Reason.PROXY and caught.value.transient
    assert "3 proxies could not be reached" in caught.value.detail
    assert alone.value.reason is Reason.PROXY
    assert "1 proxy could not be reached" in alone.value.detail  # was "1 proxies"
    assert politeness._failures == {}  # not the site's failure


# -- login ------------------------------------------------------------------------------


def members_site(net: SyntheticWeb, uses_per_login: int) -> list[str]:
    """b.test/members/N needs a session cookie from POST /login; a session lasts
    `uses_per_login` pages, then the site redirects to the login page."""
    sessions: dict[str, int] = {}
    logins: list[str] = []
    site = net.sites["b.test"]

    async def login(request: web.Request) -> web.StreamResponse:
        form = await request.post()
        if form.get("user") != "ann" or form.get("password") != "secret":
            return web.Response(status=403, text="wrong password")
        token = f"token-{len(logins)}"
        logins.append(token)
        sessions[token] = uses_per_login
        answer = web.Response(status=302, headers={"Location": "/members/home"})
        answer.set_cookie("session", token)
        return answer

    async def members(request: web.Request) -> web.StreamResponse:
        token = request.cookies.get("session", "")
        if sessions.get(token, 0) <= 0:
            raise web.HTTPFound("/login")
        sessions[token] -= 1
        return web.Response(text=f"<title>secret {request.path}</title>", content_type="text/html")

    site.routes["/login"] = login
    for n in range(6):
        site.routes[f"/members/{n}"] = members
    site.routes["/members/home"] = respond(200, "<title>home</title>")
    return logins


async def test_login_once_reuse_the_cookie_and_log_in_again_when_it_expires(
    net: SyntheticWeb,
) -> None:
    logins = members_site(net, uses_per_login=4)
    performed: list[int] = []

    async def sign_in(session: Session) -> None:
        performed.append(1)
        response = await session.post(
            net.url("b.test", "/login"), data={"user": "ann", "password": "secret"}
        )
        assert response.status == 200

    async with Fetcher(fetch_settings(net)) as fetcher:
        fetcher.add_login("b.test", Login(perform=sign_in))
        first = await asyncio.gather(
            *(fetcher.fetch(net.url("b.test", f"/members/{n}")) for n in range(3))
        )
        later = [await fetcher.fetch(net.url("b.test", f"/members/{n}")) for n in (3, 4, 5)]
        other = await fetcher.fetch(net.url("a.test", "/page/0"))
    assert [r.text() for r in first + later] == [
        f"<title>secret /members/{n}</title>" for n in range(6)
    ]
    assert logins == ["token-0", "token-1"]  # once for 3 concurrent pages, once on expiry
    assert len(performed) == 2
    member_hits = [h for h in net.hits_for("b.test") if h.path.startswith("/members/")]
    assert {h.cookies.get("session") for h in member_hits} <= {"token-0", "token-1"}
    assert other.status == 200
    assert all("session" not in h.cookies for h in net.hits_for("a.test"))


async def test_a_redirect_into_a_login_domain_goes_with_that_domains_session(
    net: SyntheticWeb,
) -> None:
    """a.test/go -> b.test/members/1: b.test's own session, signed in, with its cookie; and
    none of the caller's credentials, which were for a.test."""
    logins = members_site(net, uses_per_login=1_000)
    net.sites["a.test"].routes["/go"] = redirect(net.url("b.test", "/members/1"))

    async def sign_in(session: Session) -> None:
        await session.post(net.url("b.test", "/login"), data={"user": "ann", "password": "secret"})
        session.client.headers["Authorization"] = "Bearer B-TOKEN"

    async with Fetcher(fetch_settings(net)) as fetcher:
        fetcher.add_login("b.test", Login(perform=sign_in))
        response = await fetcher.fetch(net.url("a.test", "/go"), headers={"Authorization": "A"})
    assert response.text() == "<title>secret /members/1</title>"
    assert logins == ["token-0"]
    (hit,) = [h for h in net.hits_for("b.test") if h.path == "/members/1"]
    assert (hit.cookies.get("session"), hit.headers.get("Authorization")) == (
        "token-0",
        "Bearer B-TOKEN",
    )
    (first,) = [h for h in net.hits_for("a.test") if h.path == "/go"]
    assert first.headers.get("Authorization") == "A"


async def test_a_session_reached_by_a_redirect_logs_in_again_when_it_expires(
    net: SyntheticWeb,
) -> None:
    """a.test/go -> b.test/members/1, where b.test's session lasts one page: the second
    fetch comes back at b.test's login page, so b.test's session signs in again and the
    page is asked again, as for a URL of b.test itself."""
    logins = members_site(net, uses_per_login=1)
    net.sites["a.test"].routes["/go"] = redirect(net.url("b.test", "/members/1"))

    async def sign_in(session: Session) -> None:
        await session.post(net.url("b.test", "/login"), data={"user": "ann", "password": "secret"})

    async with Fetcher(fetch_settings(net)) as fetcher:
        fetcher.add_login("b.test", Login(perform=sign_in))
        answers = [await fetcher.fetch(net.url("a.test", "/go")) for _ in range(2)]
    assert [r.text() for r in answers] == ["<title>secret /members/1</title>"] * 2
    assert logins == ["token-0", "token-1"]


async def test_pages_that_are_forbidden_logged_in_do_not_each_cause_a_login(
    net: SyntheticWeb,
) -> None:
    """A 403 reads as a session that expired; when a new login does not help, that page's
    403s are taken as they are for FUTILE_LOGIN_QUIET seconds, and other pages still log
    in again when the session does expire."""
    logins = members_site(net, uses_per_login=2)
    net.sites["b.test"].routes["/admin"] = respond(403, "forbidden")

    async def sign_in(session: Session) -> None:
        await session.post(net.url("b.test", "/login"), data={"user": "ann", "password": "secret"})

    async with Fetcher(fetch_settings(net)) as fetcher:
        fetcher.add_login("b.test", Login(perform=sign_in))
        answers = [await fetcher.fetch(net.url("b.test", "/admin")) for _ in range(10)]
        assert logins == ["token-0", "token-1"]  # the first, and the one that did not help
        members = [await fetcher.fetch(net.url("b.test", f"/members/{n}")) for n in range(3)]
    assert [r.status for r in answers] == [403] * 10
    assert [r.text() for r in members] == [f"<title>secret /members/{n}</title>" for n in range(3)]
    assert logins == ["token-0", "token-1", "token-2"]  # the session expired after 2 pages


async def test_a_refused_login_is_not_tried_again_by_every_page_until_its_pause_ends(
    net: SyntheticWeb, monkeypatch: pytest.MonkeyPatch
) -> None:
    """20 pages at once, a password the site refuses: one login, and each page fails as the
    page (its group is paused until a login may be tried again), none as the login page."""
    clock = [1_000.0]
    monkeypatch.setattr(time, "time", lambda: clock[0])
    tries: list[int] = []

    async def sign_in(session: Session) -> None:
        tries.append(1)
        raise FetchError(Reason.LOGIN_FAILED, net.url("b.test", "/login"), "HTTP 401")

    async with Fetcher(fetch_settings(net)) as fetcher:
        fetcher.add_login("b.test", Login(perform=sign_in))
        pages = [net.url("b.test", f"/members/{n}") for n in range(20)]
        failed = await asyncio.gather(*map(fetcher.fetch, pages), return_exceptions=True)
        clock[0] += fetcher_module.LOGIN_RETRY + 1
        with pytest.raises(FetchError) as again:
            await fetcher.fetch(pages[0])
    assert len(tries) == 2  # once for the 20, once after the pause
    assert all(isinstance(e, FetchError) and e.reason is Reason.LOGIN_FAILED for e in failed)
    assert [e.url for e in failed if isinstance(e, FetchError)] == pages
    assert {e.until for e in failed if isinstance(e, FetchError)} == {1_000 + 5.0}
    assert again.value.until == clock[0] + 2 * fetcher_module.LOGIN_RETRY  # doubled
    assert paths(net, "b.test") == []


async def test_every_response_counts_in_the_worker_metrics(net: SyntheticWeb) -> None:
    from crawlq.observe.metrics import worker_metrics

    def counted(status: str) -> float:
        return sum(
            s.value
            for metric in worker_metrics().fetch_responses.collect()
            for s in metric.samples
            if s.name.endswith("_total") and s.labels.get("status") == status
        )

    before_ok, before_redirects = counted("200"), counted("301")
    net.sites["a.test"].routes["/moved"] = redirect("/page/1", 301)
    async with Fetcher(fetch_settings(net)) as fetcher:
        await fetcher.fetch(net.url("a.test", "/moved"))
        await fetcher.fetch(net.url("b.test", "/page/2"))
    # robots.txt of each host, the two pages, and the redirect hop
    assert counted("200") - before_ok >= 3
    assert counted("301") - before_redirects == 1


# -- send slots: confirmed once the connection is in hand, before a byte is written --------


@dataclasses.dataclass
class Seen:
    connections: int = 0
    data: bytes = b""


class Counting(asyncio.Protocol):
    """Counts connections and keeps every byte; answers each request with an empty 200."""

    def __init__(self, seen: Seen) -> None:
        self.seen = seen
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        self.seen.connections += 1

    def data_received(self, data: bytes) -> None:
        self.seen.data += data
        if data.endswith(b"\r\n\r\n") and self.transport is not None:
            self.transport.write(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n")


async def test_each_request_confirms_its_own_slot_once_connected_before_a_byte_is_sent() -> None:
    seen = Seen()
    server = await asyncio.get_running_loop().create_server(lambda: Counting(seen), "127.0.0.1")
    port = server.sockets[0].getsockname()[1]
    confirmed: list[tuple[str, int, bytes]] = []

    answered: list[tuple[str, int]] = []

    @dataclasses.dataclass
    class Recording:
        name: str

        async def confirm(self) -> None:
            confirmed.append((self.name, seen.connections, seen.data))

        def answered(self, status: int, retry_after: str | None) -> None:
            answered.append((self.name, status))

    paced: list[str] = []

    async def pace(hop: str) -> Recording:
        paced.append(hop)
        return Recording(f"slot {len(paced)}")

    settings = FetchSettings(
        resolve={"site.test": "127.0.0.1"}, resolve_only=True, allow_networks=("127.0.0.0/8",)
    )
    url = f"http://site.test:{port}/page"
    try:
        async with Fetcher(settings) as fetcher:
            response = await fetcher.fetch(url, pace=pace)
    finally:
        server.close()
    assert response.status == 200
    assert paced == [url, url]  # robots.txt first, then the page
    # robots.txt confirmed the first slot once connected, before any of its bytes went; the
    # page confirmed the second, on the same connection, before any of its own.
    assert confirmed == [("slot 1", 1, b""), ("slot 2", 1, confirmed[1][2])]
    assert confirmed[1][2].startswith(b"GET /robots.txt ")
    assert b"/page" not in confirmed[1][2]
    assert b"GET /page " in seen.data
    assert answered == [("slot 1", 200), ("slot 2", 200)]  # each hop's head, to its own slot


async def test_a_robots_txt_request_put_back_by_its_slot_puts_the_page_back(
    net: SyntheticWeb,
) -> None:
    """Not sent is not unavailable: the page is Throttled, robots.txt is not remembered as
    failed, and the next try fetches it."""
    refusals = [True]

    class Late:
        async def confirm(self) -> None:
            if refusals and refusals.pop():
                raise Throttled(net.url("a.test", "/robots.txt"), 0.0, "late for its slot")

        def answered(self, status: int, retry_after: str | None) -> None:
            assert status == 200 and retry_after is None

    async def pace(hop: str) -> Late:
        return Late()

    async with Fetcher(fetch_settings(net)) as fetcher:
        with pytest.raises(Throttled, match="late for its slot"):
            await fetcher.fetch(net.url("a.test", "/page/1"), pace=pace)
        assert net.hits_for("a.test") == []  # nothing was sent
        response = await fetcher.fetch(net.url("a.test", "/page/1"), pace=pace)
    assert response.status == 200
    assert paths(net, "a.test") == ["/robots.txt", "/page/1"]


async def test_a_429_head_pauses_its_group_before_the_body_is_read(
    net: SyntheticWeb, tmp_path: Path
) -> None:
    """The worker sends nothing more to a host from the moment a 429's head is in, while its
    body still comes: before, the pause began once the whole answer was read, and on a busy
    loop requests went out meanwhile (the crawl benchmark counted them)."""
    body_held = asyncio.Event()

    async def throttle_slowly(request: web.Request) -> web.StreamResponse:
        answer = web.StreamResponse(status=429, headers={"Retry-After": "30"})
        answer.enable_chunked_encoding()
        await answer.prepare(request)
        await answer.write(b"slow ")  # the head goes with the first chunk
        await body_held.wait()
        await answer.write(b"down")
        return answer

    net.sites["b.test"].routes["/page/1"] = throttle_slowly
    backend = open_backend(f"sqlite:///{tmp_path / 'queue.db'}")
    await backend.open()
    politeness = Politeness(backend)
    try:
        async with Fetcher(fetch_settings(net)) as fetcher:
            await politeness.fetch(fetcher, net.url("b.test", "/page/0"))
            first = asyncio.create_task(politeness.fetch(fetcher, net.url("b.test", "/page/1")))
            deadline = time.monotonic() + 10
            while politeness.blocked_until("b.test") is None:
                assert not first.done() and time.monotonic() < deadline, "never paused"
                await asyncio.sleep(0.005)
            with pytest.raises(Throttled, match="paused"):
                await politeness.fetch(fetcher, net.url("b.test", "/page/2"))
            body_held.set()
            with pytest.raises(Throttled, match="429 Retry-After 30"):
                await first
    finally:
        await backend.close()
    assert paths(net, "b.test") == ["/robots.txt", "/page/0", "/page/1"]


async def test_a_request_beside_one_in_flight_goes_out_past_descriptor_1024(
    net: SyntheticWeb,
) -> None:
    """Before each request, the host's other in-flight connections are looked at for an
    answer already in (crawl/answers.py): with thousands of connections open, as a crawler
    has, their descriptors pass 1024, where select() refuses them."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, 2048), hard))
    filler = [socket.socket() for _ in range(1100)]
    release = asyncio.Event()
    net.sites["b.test"].routes["/slow"] = hang(release)
    try:
        async with Fetcher(fetch_settings(net)) as fetcher:
            await fetcher.fetch(net.url("b.test", "/page/0"))
            slow = asyncio.create_task(fetcher.fetch(net.url("b.test", "/slow")))
            while "/slow" not in paths(net, "b.test"):
                await asyncio.sleep(0.005)
            beside = await fetcher.fetch(net.url("b.test", "/page/1"))
            release.set()
            assert (await slow).status == 200
    finally:
        for sock in filler:
            sock.close()
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    assert beside.status == 200
    assert paths(net, "b.test") == ["/robots.txt", "/page/0", "/slow", "/page/1"]


async def test_a_fetcher_raises_the_soft_limit_of_open_files(net: SyntheticWeb) -> None:
    """Debian's usual soft limit, 1024, is less than a broad crawl's open connections."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(1024, hard), hard))
    try:
        async with Fetcher(fetch_settings(net)) as fetcher:
            await fetcher.fetch(net.url("a.test", "/page/1"))
            raised = resource.getrlimit(resource.RLIMIT_NOFILE)
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    wanted = fetcher_module.OPEN_FILES
    assert raised == (wanted if hard == resource.RLIM_INFINITY else min(wanted, hard), hard)


async def test_a_request_whose_task_is_cancelled_by_a_timer_due_before_it_is_written_never_goes(
    net: SyntheticWeb,
) -> None:
    """The process is stopped (here: the loop blocked) right before a request on a pooled
    connection; meanwhile the worker's lease timer fell due. The timer runs before any byte
    is written, and the request never reaches the server."""
    async with Fetcher(fetch_settings(net)) as fetcher:
        await fetcher.fetch(net.url("b.test", "/page/1"))  # robots.txt known, a connection kept
        task = asyncio.current_task()
        assert task is not None

        async def stopped_meanwhile(hop: str) -> None:
            asyncio.get_running_loop().call_later(0.001, task.cancel)  # the lease watchdog
            time.sleep(0.05)  # blocks the loop on purpose: the process is stopped

        with pytest.raises(asyncio.CancelledError):
            await fetcher.fetch(net.url("b.test", "/page/2"), pace=stopped_meanwhile)
        task.uncancel()
        # Whatever was written has arrived: another request on the host is answered after it.
        await fetcher.fetch(net.url("b.test", "/page/3"))
    assert paths(net, "b.test") == ["/robots.txt", "/page/1", "/page/3"]


async def test_a_worker_forgets_send_times_and_names_of_hosts_it_left_behind(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A crawl over millions of hosts must not keep a send time and a resolved name for each
    host it ever saw: a worker keeps those of the hosts it paces now (send times within the
    longest gap it paces by; names resolved within two DNS TTLs)."""
    monkeypatch.setattr(politeness_module, "TIDY_EVERY", 0.0)
    hosts = [f"h{n}.test" for n in range(12)]
    backend = open_backend(f"sqlite:///{tmp_path / 'queue.db'}")
    await backend.open()
    await backend.set_limits([LimitRule(pattern="*.test", limit=Limit(interval=0.05))])
    politeness = Politeness(backend)
    try:
        async with (
            SyntheticWeb([Site(name=host, pages=2) for host in hosts]) as net,
            Fetcher(fetch_settings(net, dns_ttl=3600)) as fetcher,
        ):
            for host in hosts:
                await politeness.fetch(fetcher, net.url(host, "/page/0"))
            assert resolved_names(fetcher) == set(hosts)
            await asyncio.sleep(0.1)  # past the 0.05 s gap: every send time is stale now
            fetcher._dns_cleared -= 3600  # and the names have been kept a TTL
            await politeness.fetch(fetcher, net.url("h0.test", "/page/1"))
            assert fetcher._sent.keys() == {"h0.test"}
            assert politeness._last_sent.keys() == {"h0.test"}
            assert resolved_names(fetcher) <= {"h0.test"}  # its connection may still be open
            assert [hit.path for hit in net.hits_for("h0.test")][-1] == "/page/1"
    finally:
        await backend.close()


async def test_a_worker_forgets_ended_blocks_old_failures_and_delays_of_idle_hosts(
    tmp_path: Path,
) -> None:
    """What politeness keeps by group lasts while it matters: a block until it ends, failures
    in a row FAILURE_MEMORY after the last (not while a backoff they caused lasts), and a
    Crawl-delay while this worker has a send to the group within its longest gap."""
    now = [1_000.0]
    backend = open_backend(f"sqlite:///{tmp_path / 'queue.db'}")
    await backend.open()
    politeness = Politeness(
        backend, backoff=Backoff(after=2, base=7_200, cap=7_200), clock=lambda: now[0]
    )
    try:
        await politeness.block("paused.test", 1_010.0, "429 Retry-After 10")
        await politeness.failed("once.test", "HTTP 500")
        await politeness.failed("backed-off.test", "HTTP 500")
        await politeness.failed("backed-off.test", "HTTP 500")  # blocked 7,200 s
        await politeness.crawl_delay("idle.test", 2.0)
        await politeness.crawl_delay("busy.test", 2.0)
        async with Fetcher() as fetcher:
            now[0] += politeness_module.TIDY_EVERY
            politeness.sent_at("busy.test", now[0])
            politeness.tidy(fetcher)
            assert politeness._blocked.keys() == {"backed-off.test"}
            assert politeness._block_reasons.keys() == {"backed-off.test"}
            assert politeness._delays == {"busy.test": 2.0}
            assert politeness._failures.keys() == {"once.test", "backed-off.test"}
            now[0] += politeness_module.FAILURE_MEMORY
            politeness.tidy(fetcher)
            assert politeness._failures.keys() == {"backed-off.test"}  # still blocked
            now[0] += 7_200
            politeness.tidy(fetcher)
            assert politeness._failures == {} and politeness._blocked == {}
        assert await backend.crawl_delays() == {"idle.test": 2.0, "busy.test": 2.0}
    finally:
        await backend.close()


async def test_a_host_that_answers_a_redirect_has_not_failed_in_a_row(
    net: SyntheticWeb, tmp_path: Path
) -> None:
    answers = iter([respond(500, "down"), redirect(net.url("b.test", "/page/1"))])

    async def flaky(request: web.Request) -> web.StreamResponse:
        return await next(answers)(request)

    net.sites["a.test"].routes["/moved"] = flaky
    backend = open_backend(f"sqlite:///{tmp_path / 'queue.db'}")
    await backend.open()
    politeness = Politeness(backend)
    try:
        async with Fetcher(fetch_settings(net)) as fetcher:
            first = await politeness.fetch(fetcher, net.url("a.test", "/moved"))
            assert politeness._failures.keys() == {"a.test"}
            second = await politeness.fetch(fetcher, net.url("a.test", "/moved"))
    finally:
        await backend.close()
    assert (first.status, second.status) == (500, 200)
    assert politeness._failures == {}


def resolved_names(fetcher: Fetcher) -> set[str]:
    """The names in aiohttp's DNS cache (a private table: keyed by (host, port))."""
    assert fetcher._connector is not None
    return {host for host, _ in fetcher._connector._cached_hosts._addrs_rr}
