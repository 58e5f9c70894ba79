"""A rendered page reading other sites through crawlq, against the synthetic web in Debian's
headless Chromium: a page's requests to another site go without the crawl's cookies and
logins, and its scripts read another origin's answer only if that origin's server allows
it (CORS judged by crawlq on the server's real answer, its preflight included, never
answered by Playwright), while the page's own site keeps its session and other sites'
scripts and images still load."""

from __future__ import annotations

import json
import os
import re
import struct
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from crawlq import Context, Retry
from crawlq.app import App
from crawlq.crawl.browser import DEFAULT_CHROMIUM, Browser, BrowserSettings, Rendered
from crawlq.crawl.fetcher import Fetcher, Login, Session
from crawlq.crawl.testing import Site, SyntheticWeb, redirect, respond
from crawlq.crawl.testing.sites import Hit, page_html
from crawlq.worker import Worker

from .conftest import fetch_settings

#: The page's script: `read(id, url, init)` fetches `url` and writes what it read (or that
#: the fetch failed) into a <p id=id>; `done()` marks the page as finished.
READ = """
async function read(id, url, init) {
  let text;
  try {
    const answer = await fetch(url, init);
    text = 'read:' + (await answer.text());
  } catch (error) {
    text = 'failed';
  }
  const p = document.createElement('p');
  p.id = id;
  p.textContent = text;
  document.body.append(p);
}
function done() {
  const p = document.createElement('p');
  p.id = 'done';
  document.body.append(p);
}
"""
SECRET = "SECRET-OF-B"
SET_SESSION = "sid=secret-b; Path=/; HttpOnly; SameSite=Strict"


@pytest.fixture(autouse=True)
def chromium() -> None:
    """Chromium is a requirement of these tests, not an option: missing, they fail."""
    if not os.path.exists(DEFAULT_CHROMIUM):
        pytest.fail(f"{DEFAULT_CHROMIUM} is missing: run `bash scripts/install-chromium.sh`")
    os.environ.setdefault("PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD", "1")


def script_page(script: str) -> Any:
    return respond(body=page_html("reader", [], f"<script>{READ}{script}</script>"))


def account(cors: Callable[[web.Request], dict[str, str]] | None = None) -> Any:
    """B's account page: its secret to a request with B's session cookie, else a page for
    anyone; with the headers `cors(request)` gives."""

    async def handler(request: web.Request) -> web.StreamResponse:
        text = SECRET if request.cookies.get("sid") == "secret-b" else "anonymous"
        headers = cors(request) if cors is not None else {}
        return web.Response(text=text, content_type="text/plain", headers=headers)

    return handler


def allow(origin: str, *, credentials: bool = False) -> dict[str, str]:
    headers = {"Access-Control-Allow-Origin": origin}
    if credentials:
        headers["Access-Control-Allow-Credentials"] = "true"
    return headers


def read(html: str | None, name: str) -> str | None:
    """What the page's script wrote into <p id=name>."""
    assert html is not None
    found = re.search(rf'<p id="{name}">(.*?)</p>', html)
    return found.group(1) if found else None


def hits(net: SyntheticWeb, host: str, path: str) -> list[Hit]:
    return [h for h in net.hits if h.host == host and h.path == path]


def header(hit: Hit, name: str) -> str | None:
    return next((v for k, v in hit.headers.items() if k.lower() == name.lower()), None)


async def render(
    tmp_path: Path,
    net: SyntheticWeb,
    url: str,
    *,
    first: tuple[str, ...] = (),
    logins: dict[str, Login] | None = None,
    media: bool = False,
) -> Rendered:
    """A task, run once by a burst worker, that fetches the URLs in `first` (which sign it
    in to sites, through `logins` or their cookies), then renders `url` until `#done`."""
    app = App(f"sqlite:///{tmp_path / 'q.db'}")

    def fetcher() -> Fetcher:
        made = Fetcher(fetch_settings(net))
        for domain, login in (logins or {}).items():
            made.add_login(domain, login)
        return made

    app.provide("crawlq.fetcher", fetcher)
    app.provide("crawlq.browser", lambda: Browser(BrowserSettings(timeout=20, media=media)))
    rendered: list[Rendered] = []

    @app.task(retry=Retry(max_attempts=1))
    async def visit(ctx: Context, url: str) -> None:
        for signed_in in first:
            await ctx.fetch(signed_in)
        rendered.append(await ctx.render(url, wait_for="#done"))

    await app.aschedule(visit, url)
    stats = await Worker(app, burst=True).run()
    await app.aclose()
    assert stats.done == 1, stats
    return rendered[0]


async def test_a_page_cannot_read_another_sites_pages_the_crawl_is_logged_in_to(
    tmp_path: Path,
) -> None:
    """The crawl is signed in to b.test by its login hook (a SameSite=Strict, HttpOnly
    cookie) and has read B's account page; a.test's page then fetches that page with
    credentials: 'include'. The request reaches B without the cookie (nor a new login), and
    B's answer, which allows no other origin, fails in the page as a browser fails it."""
    sites = [
        Site(name="a.test"),
        Site(
            name="b.test",
            routes={"/login": respond(headers={"Set-Cookie": SET_SESSION}), "/account": account()},
        ),
    ]
    async with SyntheticWeb(sites) as net:
        target = net.url("b.test", "/account")

        async def sign_in(session: Session) -> None:
            await session.post(net.url("b.test", "/login"))

        script = f"read('b', {json.dumps(target)}, {{credentials: 'include'}}).then(done);"
        net.sites["a.test"].routes["/"] = script_page(script)
        rendered = await render(
            tmp_path,
            net,
            net.url("a.test", "/"),
            first=(target,),
            logins={"b.test": Login(perform=sign_in)},
        )
    assert read(rendered.html, "b") == "failed"
    assert SECRET not in (rendered.html or "")
    by_crawl, by_page = hits(net, "b.test", "/account")
    assert by_crawl.cookies == {"sid": "secret-b"}  # the crawl itself was signed in
    assert by_page.cookies == {} and header(by_page, "Cookie") is None
    assert header(by_page, "Origin") == net.url("a.test", "")
    assert len(hits(net, "b.test", "/login")) == 1  # the page's request signed nobody in
    (refused,) = [r for r in rendered.resources if r.url == target]
    assert refused.error == "cors", refused


async def test_another_origin_is_read_only_if_it_allows_the_pages_origin_and_never_logged_in(
    tmp_path: Path,
) -> None:
    """B's session cookie is in the crawl's jar. B's /account allows a.test's origin, with
    credentials: the page reads it, but as anyone reads it (the cookie never went). B's
    /public allows no origin: the page cannot read it, though no credentials are involved
    (Playwright would have answered the CORS check itself, allowing it)."""
    sites = [
        Site(name="a.test"),
        Site(
            name="b.test",
            routes={
                "/": respond(body="home", headers={"Set-Cookie": SET_SESSION}),
                "/public": respond(body="public", content_type="text/plain"),
            },
        ),
    ]
    async with SyntheticWeb(sites) as net:
        origin = net.url("a.test", "")
        net.sites["b.test"].routes["/account"] = account(lambda _: allow(origin, credentials=True))
        allowed, public = net.url("b.test", "/account"), net.url("b.test", "/public")
        script = (
            f"read('allowed', {json.dumps(allowed)}, {{credentials: 'include'}})"
            f".then(() => read('public', {json.dumps(public)})).then(done);"
        )
        net.sites["a.test"].routes["/"] = script_page(script)
        rendered = await render(
            tmp_path, net, net.url("a.test", "/"), first=(net.url("b.test", "/"),)
        )
    assert read(rendered.html, "allowed") == "read:anonymous"
    assert read(rendered.html, "public") == "failed"
    (by_page,) = hits(net, "b.test", "/account")
    assert by_page.cookies == {} and header(by_page, "Cookie") is None


def echo_session(origin: str) -> Any:
    """The `sid` cookie the request came with, readable from `origin` with credentials."""

    async def handler(request: web.Request) -> web.StreamResponse:
        sid = request.cookies.get("sid", "none")
        headers = allow(origin, credentials=True)
        return web.Response(text=f"sid={sid}", content_type="text/plain", headers=headers)

    return handler


def with_session(sid: str) -> Any:
    return respond(body="home", headers={"Set-Cookie": f"sid={sid}; Path=/; SameSite=Strict"})


async def test_the_pages_own_site_keeps_its_session_and_another_site_gets_none(
    tmp_path: Path,
) -> None:
    """www.example.com's page (every name here resolves to the synthetic web on loopback)
    fetches its own origin, api.example.com (the same site: the same registered domain) and
    www.example.net (another site), each holding a session cookie in the crawl's jar, each
    allowing the page's origin with credentials: the first two get their cookie, the last
    none. A module script from api.example.com (a CORS request a browser sends without
    credentials) goes without, and runs on its `Access-Control-Allow-Origin: *`."""
    names = ("www.example.com", "api.example.com", "www.example.net")
    async with SyntheticWeb([Site(name=name) for name in names]) as net:
        origin = net.url("www.example.com", "")
        for name, sid in zip(names, ("www", "api", "net"), strict=True):
            net.sites[name].routes["/"] = with_session(sid)
            net.sites[name].routes["/data"] = echo_session(origin)
        own, api, other = (json.dumps(net.url(name, "/data")) for name in names)
        net.sites["api.example.com"].routes["/module.js"] = respond(
            body="document.body.insertAdjacentHTML('beforeend', '<p id=module>ran</p>');",
            content_type="application/javascript",
            headers={"Access-Control-Allow-Origin": "*"},
        )
        module = json.dumps(net.url("api.example.com", "/module.js"))
        script = (  # once loaded: the module has run by then
            f"window.addEventListener('load', () => read('own', {own}, {{credentials: 'include'}})"
            f".then(() => read('api', {api}, {{credentials: 'include'}}))"
            f".then(() => read('other', {other}, {{credentials: 'include'}})).then(done));"
        )
        body = f"<script type=module src={module}></script><script>{READ}{script}</script>"
        net.sites["www.example.com"].routes["/page"] = respond(body=page_html("site", [], body))
        rendered = await render(
            tmp_path,
            net,
            net.url("www.example.com", "/page"),
            first=tuple(net.url(name, "/") for name in names),
        )
    assert read(rendered.html, "own") == "read:sid=www"
    assert read(rendered.html, "api") == "read:sid=api"
    assert read(rendered.html, "other") == "read:sid=none"
    assert read(rendered.html, "module") == "ran"
    (loaded,) = hits(net, "api.example.com", "/module.js")
    assert loaded.cookies == {}


async def test_an_api_of_the_site_open_to_any_origin_is_read_as_anyone_reads_it(
    tmp_path: Path,
) -> None:
    """www.example.com's page fetches api.example.com (the same site, holding a session
    cookie in the crawl's jar), which answers `Access-Control-Allow-Origin: *`, as public
    APIs do: a browser's fetch() sends no credentials by default and reads the answer.
    crawlq cannot see the credentials mode, and sends the site's cookie first; `*` does not
    allow credentials, so it reads the answer again without, and the page gets that one
    (refused, a page of a single-page app would break). A fetch() asking for credentials
    fails, as in a browser: Chromium checks that `*` much as crawlq does."""
    names = ("www.example.com", "api.example.com")
    async with SyntheticWeb([Site(name=name) for name in names]) as net:
        net.sites["api.example.com"].routes["/"] = with_session("api")

        async def public(request: web.Request) -> web.StreamResponse:
            sid = request.cookies.get("sid", "none")
            headers = {"Access-Control-Allow-Origin": "*"}
            return web.Response(text=f"sid={sid}", content_type="text/plain", headers=headers)

        net.sites["api.example.com"].routes["/public"] = public
        api = json.dumps(net.url("api.example.com", "/public"))
        net.sites["www.example.com"].routes["/page"] = script_page(
            f"read('default', {api}).then(() => read('included', {api},"
            " {credentials: 'include'})).then(done);"
        )
        rendered = await render(
            tmp_path,
            net,
            net.url("www.example.com", "/page"),
            first=(net.url("api.example.com", "/"),),
        )
    assert read(rendered.html, "default") == "read:sid=none"
    assert read(rendered.html, "included") == "failed"  # Chromium's own check: `*` and include
    sent = [h.cookies.get("sid") for h in hits(net, "api.example.com", "/public")]
    assert sent == ["api", None, "api", None]


async def test_a_redirect_to_another_origin_of_the_site_goes_on_without_the_session(
    tmp_path: Path,
) -> None:
    """crawlq follows redirects itself, and Chromium takes where one led as the URL it
    asked for: the page's same-origin fetch('/go'), redirected to api.example.com, would
    read that origin's logged-in answer as its own. The hop to api.example.com goes without
    its cookie."""
    names = ("www.example.com", "api.example.com")
    async with SyntheticWeb([Site(name=name) for name in names]) as net:
        origin = net.url("www.example.com", "")
        net.sites["api.example.com"].routes["/"] = with_session("api")
        net.sites["api.example.com"].routes["/data"] = echo_session(origin)
        net.sites["www.example.com"].routes["/go"] = redirect(net.url("api.example.com", "/data"))
        script = "read('go', '/go', {credentials: 'include'}).then(done);"
        net.sites["www.example.com"].routes["/page"] = script_page(script)
        rendered = await render(
            tmp_path,
            net,
            net.url("www.example.com", "/page"),
            first=(net.url("api.example.com", "/"),),
        )
    assert read(rendered.html, "go") == "read:sid=none"
    (hop,) = hits(net, "api.example.com", "/data")
    assert hop.cookies == {}


def preflighted(origin: str | None) -> Any:
    """A PUT endpoint whose preflight allows `origin` (None: refuses every origin)."""

    async def handler(request: web.Request) -> web.StreamResponse:
        if request.method == "OPTIONS":
            if origin is None:
                return web.Response(status=405)
            headers = allow(origin)
            headers["Access-Control-Allow-Methods"] = "PUT"
            headers["Access-Control-Allow-Headers"] = "X-Widget"
            return web.Response(status=204, headers=headers)
        headers = allow(origin) if origin is not None else {}
        return web.Response(text="changed", content_type="text/plain", headers=headers)

    return handler


async def test_a_request_that_needs_a_preflight_is_sent_only_if_the_real_preflight_allows_it(
    tmp_path: Path,
) -> None:
    """The page PUTs, with a header of its own, to two endpoints of b.test: crawlq sends the
    preflight itself (Playwright answers Chromium's, allowing everything), without
    credentials, as the PUT goes too (b.test is another site). /refused's preflight allows
    nothing: its PUT is never sent. /allowed's allows a.test: its PUT is sent and read."""
    sites = [Site(name="a.test"), Site(name="b.test", routes={"/": with_session("b")})]
    async with SyntheticWeb(sites) as net:
        origin = net.url("a.test", "")
        net.sites["b.test"].routes["/refused"] = preflighted(None)
        net.sites["b.test"].routes["/allowed"] = preflighted(origin)
        init = "{method: 'PUT', headers: {'X-Widget': 'w'}}"
        refused, allowed = net.url("b.test", "/refused"), net.url("b.test", "/allowed")
        script = (
            f"read('refused', {json.dumps(refused)}, {init})"
            f".then(() => read('allowed', {json.dumps(allowed)}, {init})).then(done);"
        )
        net.sites["a.test"].routes["/"] = script_page(script)
        rendered = await render(
            tmp_path, net, net.url("a.test", "/"), first=(net.url("b.test", "/"),)
        )
    assert read(rendered.html, "refused") == "failed"
    assert read(rendered.html, "allowed") == "read:changed"
    assert [h.method for h in hits(net, "b.test", "/refused")] == ["OPTIONS"]
    preflight, put = hits(net, "b.test", "/allowed")
    assert (preflight.method, put.method) == ("OPTIONS", "PUT")
    assert header(preflight, "Origin") == origin
    assert header(preflight, "Access-Control-Request-Method") == "PUT"
    assert header(preflight, "Access-Control-Request-Headers") == "x-widget"
    assert preflight.cookies == {} and put.cookies == {}
    assert header(put, "X-Widget") == "w"


def png() -> bytes:
    """A 1x1 PNG."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        body = kind + data
        return struct.pack(">I", len(data)) + body + struct.pack(">I", zlib.crc32(body))

    header = struct.pack(">IIBBBBB", 1, 1, 8, 2, 0, 0, 0)
    pixels = zlib.compress(b"\x00\xff\x00\x00")
    return (
        b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", pixels) + chunk(b"IEND", b"")
    )


async def test_another_sites_images_and_scripts_still_load_without_the_crawls_cookies(
    tmp_path: Path,
) -> None:
    """a.test's page loads an image and a script from b.test (a CDN, say), plain no-cors
    requests with no CORS headers in their answers: both load (the image is decoded, the
    script runs), and neither request carried b.test's session cookie."""
    sites = [
        Site(name="a.test"),
        Site(
            name="b.test",
            routes={
                "/": with_session("b"),
                "/pixel.png": respond(body=png(), content_type="image/png"),
                "/lib.js": respond(
                    body="window.libLoaded = true;", content_type="application/javascript"
                ),
            },
        ),
    ]
    async with SyntheticWeb(sites) as net:
        image, lib = net.url("b.test", "/pixel.png"), net.url("b.test", "/lib.js")
        body = (
            f"<script src={json.dumps(lib)}></script>"
            f"<img id=pixel src={json.dumps(image)}>"
            "<script>"
            f"{READ}"
            "window.addEventListener('load', () => {"
            "  const width = document.getElementById('pixel').naturalWidth;"
            "  document.body.insertAdjacentHTML('beforeend',"
            "    `<p id=image>${width}</p><p id=lib>${window.libLoaded === true}</p>`);"
            "  done();"
            "});"
            "</script>"
        )
        net.sites["a.test"].routes["/"] = respond(body=page_html("cdn", [], body))
        rendered = await render(
            tmp_path, net, net.url("a.test", "/"), first=(net.url("b.test", "/"),), media=True
        )
    assert read(rendered.html, "image") == "1"
    assert read(rendered.html, "lib") == "true"
    for path in ("/pixel.png", "/lib.js"):
        (hit,) = hits(net, "b.test", path)
        assert hit.cookies == {}, path
