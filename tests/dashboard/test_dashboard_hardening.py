"""The dashboard hardened against other web pages, weak tokens and token guessing: over real
HTTP against a real dashboard (uvicorn on a loopback port, in a thread here so that the login
limit's clock is the test's) on a real SQLite file, or the real `crawlq dashboard` command."""

from __future__ import annotations

import asyncio
import http.client
import http.server
import os
import secrets
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import pytest
import uvicorn
from playwright.sync_api import Response, sync_playwright

from crawlq.backends import open_backend
from crawlq.cli.dashboard import allowed_hosts
from crawlq.errors import ConfigError
from crawlq.observe.dashboard import LOOPBACK_HOSTS, Dashboard
from crawlq.observe.security import (
    LOGIN_ADDRESSES,
    LOGIN_FAILURES,
    LOGIN_FAILURES_ALL,
    LOGIN_WINDOW,
    TOKEN_COOKIE,
    LoginLimit,
)
from crawlq.types import QueueConfig, Schedule

from ..helpers import ManualClock
from .conftest import ROOT, wait_for
from .test_dashboard import CHROMIUM

TOKEN = secrets.token_urlsafe(24)


@dataclass
class Answer:
    status: int
    headers: http.client.HTTPMessage
    body: str

    def cookie(self, name: str) -> str | None:
        """The value `name` is set to, if a Set-Cookie sets it."""
        for value in self.headers.get_all("set-cookie") or []:
            if value.startswith(f"{name}="):
                return value.split(";", 1)[0].split("=", 1)[1]
        return None


@dataclass
class Served:
    port: int

    def send(
        self,
        path: str,
        *,
        method: str = "GET",
        headers: dict[str, str] | None = None,
        form: dict[str, str] | None = None,
        source: str = "127.0.0.1",
    ) -> Answer:
        """One request from the address `source` (any of 127.0.0.0/8), no redirect followed."""
        connection = http.client.HTTPConnection(
            "127.0.0.1", self.port, timeout=30, source_address=(source, 0)
        )
        try:
            body = urlencode(form).encode() if form is not None else None
            sent = dict(headers or {})
            if body is not None:
                sent["Content-Type"] = "application/x-www-form-urlencoded"
            connection.request(method, path, body=body, headers=sent)
            got = connection.getresponse()
            return Answer(got.status, got.headers, got.read().decode())
        finally:
            connection.close()


Serve = Callable[..., Served]


async def _fill(url: str) -> None:
    """A queue `pages` with an element in group a.test."""
    backend = open_backend(url, create=True)
    await backend.open()
    try:
        await backend.ensure_queues([QueueConfig(name="pages")])
        key = '"http://a.test/1"'
        element = Schedule(queue="pages", key=key, payload='"x"', group="a.test", due=0)
        await backend.schedule([element])
    finally:
        await backend.close()


@pytest.fixture
def serve(tmp_path: Path) -> Iterator[Serve]:
    """Starts a dashboard (no cache) over a SQLite file holding the queue `pages`; with
    `token`, `clock` times its login limit."""
    stops: list[Callable[[], None]] = []

    def start(*, token: str | None = None, clock: Callable[[], float] | None = None) -> Served:
        url = f"sqlite:///{tmp_path / f'board{len(stops)}.db'}"
        asyncio.run(_fill(url))
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.bind(("127.0.0.1", 0))
        sock.listen(64)
        servers: list[uvicorn.Server] = []
        failed: list[BaseException] = []

        async def main() -> None:
            backend = open_backend(url, create=False)
            await backend.open()
            try:
                board = Dashboard(backend, token=token, ttl=0, clock=clock or time.monotonic)
                app = board.app(allowed_hosts=allowed_hosts("127.0.0.1", LOOPBACK_HOSTS))
                config = uvicorn.Config(app, log_config=None, access_log=False, lifespan="on")
                servers.append(uvicorn.Server(config))
                await servers[0].serve(sockets=[sock])
            finally:
                await backend.close()

        def run() -> None:
            try:
                asyncio.run(main())
            except BaseException as exc:  # shown by the readiness wait below
                failed.append(exc)

        thread = threading.Thread(target=run, name="dashboard", daemon=True)
        thread.start()

        def stop() -> None:
            if servers:
                servers[0].should_exit = True
            thread.join(timeout=30)
            sock.close()

        stops.append(stop)
        wait_for(lambda: failed or (servers and servers[0].started), "the dashboard to listen")
        assert not failed, failed
        return Served(port=sock.getsockname()[1])

    try:
        yield start
    finally:
        for stop in stops:
            stop()


# -- 1. another web page's requests ------------------------------------------------------------

#: The headers Chromium sends with a request another site's page makes without the user (an
#: <img>, a no-cors fetch, a form post, a frame), or a page on another port of 127.0.0.1.
CROSS_SITE = {
    "Sec-Fetch-Site": "cross-site",
    "Sec-Fetch-Mode": "no-cors",
    "Sec-Fetch-Dest": "image",
}
SAME_SITE = {**CROSS_SITE, "Sec-Fetch-Site": "same-site"}
CLICKED = {
    "Sec-Fetch-Site": "cross-site",
    "Sec-Fetch-Mode": "navigate",
    "Sec-Fetch-Dest": "document",
    "Sec-Fetch-User": "?1",
}
ELEMENT = "/element?" + urlencode({"queue": "pages", "key": '"http://a.test/1"'})
ROUTES = [
    ELEMENT,
    "/",
    "/groups",
    "/workers",
    "/dead",
    "/metrics",
    "/api/stats",
    "/static/dashboard.js",
]


def test_a_tokenless_dashboard_refuses_other_pages_requests_before_any_read(serve: Serve) -> None:
    """Without a token, any page the operator visits could make the browser ask for any page
    (on Redis, an element's page scans every group): each such request is refused, on every
    route, before the page is made; Prometheus and scripts (no Sec-Fetch-* headers), the
    dashboard's own pages and a link the user clicked still get the page."""
    board = serve()
    for path in ROUTES:
        for headers in (CROSS_SITE, SAME_SITE):
            got = board.send(path, headers=headers)
            assert got.status == 403, (path, headers, got.status, got.body[:200])
            assert "another web page" in got.body and "a.test" not in got.body
        assert board.send(path).status == 200, path  # Prometheus, curl: no Sec-Fetch-*
        for site in ("same-origin", "none"):  # its own pages; an address typed
            assert board.send(path, headers={"Sec-Fetch-Site": site}).status == 200, (path, site)
    page = board.send(ELEMENT)
    assert "http://a.test/1" in page.body, "the element's page, read from the backend"
    assert board.send(ELEMENT, headers=CLICKED).status == 200, "a link clicked in a runbook"
    scripted = {**CLICKED, "Sec-Fetch-User": "?0"}  # a page's script navigating, no click
    assert board.send(ELEMENT, headers=scripted).status == 403
    framed = {**CLICKED, "Sec-Fetch-Dest": "iframe"}
    assert board.send(ELEMENT, headers=framed).status == 403
    posted = board.send(
        "/dead/purge", method="POST", headers=CROSS_SITE, form={"queue": "pages", "all": "1"}
    )
    assert posted.status == 403 and "another web page" in posted.body
    other_origin = {"Origin": "http://evil.test", "Sec-Fetch-Site": "cross-site"}
    assert board.send("/api/stats", headers=other_origin).status == 403


class _Other(http.server.BaseHTTPRequestHandler):
    """Another site's page (served on localhost, the dashboard on 127.0.0.1): a frame, a
    script's fetch and a link, each to the dashboard's element page."""

    target = ""

    def do_GET(self) -> None:
        body = (
            f'<!doctype html><iframe src="{self.target}&via=frame"></iframe>'
            f'<a id="link" href="{self.target}&via=link">open</a>'
            f"<script>fetch({self.target + '&via=fetch'!r}, {{mode: 'no-cors'}})</script>"
        ).encode()
        self.send_response(200)
        self.send_header("content-type", "text/html")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


def test_in_chromium_another_sites_page_is_refused_and_a_clicked_link_is_not(
    serve: Serve,
) -> None:
    """What Chromium really sends: another site's frame and fetch of the element page get
    403; the same page opened from its address, or by clicking that site's link, gets it."""
    board = serve()
    target = f"http://127.0.0.1:{board.port}{ELEMENT}"
    handler = type("Other", (_Other,), {"target": target})
    other = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=other.serve_forever, daemon=True).start()
    os.environ.setdefault("PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD", "1")
    statuses: dict[str, int] = {}
    try:
        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path=CHROMIUM, headless=True)
            try:
                page = browser.new_page()

                def seen(response: Response) -> None:
                    if "via=" in response.url:
                        statuses[response.url.rsplit("via=", 1)[1]] = response.status

                page.on("response", seen)
                page.goto(f"http://localhost:{other.server_address[1]}/")
                page.wait_for_load_state("networkidle")
                with page.expect_navigation():
                    page.click("#link")
                assert "http://a.test/1" in page.content(), "the element's page"
                typed = page.goto(target + "&via=typed")
                assert typed is not None
            finally:
                browser.close()
    finally:
        other.shutdown()
        other.server_close()
    assert statuses == {"frame": 403, "fetch": 403, "link": 200, "typed": 200}, statuses


# -- 2. weak tokens ------------------------------------------------------------------------------


def test_a_weak_token_is_refused_at_start_saying_how_to_make_one(tmp_path: Path) -> None:
    """16 characters were the only rule: aaaaaaaaaaaaaaaa, 1234567890123456 or
    passwordpassword started a dashboard."""
    environ = {k: v for k, v in os.environ.items() if not k.startswith("CRAWLQ_")}
    environ.update(
        CRAWLQ_BACKEND=f"sqlite:///{tmp_path / 'weak.db'}",
        PYTHONPATH=os.pathsep.join([str(ROOT / "src"), str(ROOT)]),
    )
    asyncio.run(_fill(environ["CRAWLQ_BACKEND"]))
    weak = ["aaaaaaaaaaaaaaaa", "1234567890123456", "abcdefghijklmnopqr", "passwordpassword"]
    for token in weak:
        with pytest.raises(ConfigError, match="make one with"):
            Dashboard(open_backend(environ["CRAWLQ_BACKEND"], create=False), token=token)
    for token in weak:
        ran = subprocess.run(
            [sys.executable, "-m", "crawlq", "dashboard", "--port", "0", "--token", token],
            env=environ,
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=60,
        )
        said = ran.stdout + ran.stderr
        assert ran.returncode == 1, (token, said)
        assert said.startswith("Error: the dashboard token must be") and said.count("\n") == 1
        assert "secrets.token_urlsafe(32)" in said and token not in said
    shown = subprocess.run(
        [sys.executable, "-m", "crawlq", "dashboard", "--help"],
        env={**environ, "COLUMNS": "200"},
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    ).stdout
    assert "6 or more of them different" in " ".join(shown.split())


# -- 3. guessing the token ---------------------------------------------------------------------


def test_wrong_tokens_from_one_address_are_limited_by_the_clock(serve: Serve) -> None:
    """Failed logins were never limited: a script could try tokens as fast as the dashboard
    answers. Past LOGIN_FAILURES a minute from one address, every token it gives (right or
    wrong, so the answer tells no right guess) gets 429 until the window passes by the
    dashboard's clock; another address, and a browser already logged in, are unaffected."""
    clock = ManualClock()
    board = serve(token=TOKEN, clock=clock)
    wrong = {"token": "x" + TOKEN, "next": "/"}
    for _ in range(LOGIN_FAILURES - 1):
        assert board.send("/login", method="POST", form=wrong).status == 401
    logged_in = board.send("/login", method="POST", form={"token": TOKEN, "next": "/"})
    assert logged_in.status == 303, "a right token forgives the wrong ones before it"
    login = logged_in.cookie(TOKEN_COOKIE)
    assert login
    for _ in range(LOGIN_FAILURES):  # the form, ?token= and a Bearer count alike
        assert board.send("/login", method="POST", form=wrong).status == 401
    clock.advance(LOGIN_WINDOW - 1)
    for attempt in (
        board.send("/login", method="POST", form=wrong),
        board.send("/login", method="POST", form={"token": TOKEN}),
        board.send("/?" + urlencode({"token": TOKEN})),
        board.send("/metrics", headers={"Authorization": f"Bearer {TOKEN}"}),
    ):
        assert attempt.status == 429, attempt.body
        assert attempt.headers["retry-after"] == "1"
        assert attempt.cookie(TOKEN_COOKIE) is None
    cookie = {"Cookie": f"{TOKEN_COOKIE}={login}"}
    assert board.send("/", headers=cookie).status == 200, "a logged-in browser still works"
    other = board.send("/login", method="POST", form={"token": TOKEN}, source="127.0.0.2")
    assert other.status == 303, "another address may log in"
    clock.advance(1)
    assert board.send("/metrics", headers={"Authorization": f"Bearer {TOKEN}"}).status == 200
    # A local process may claim any address in X-Forwarded-For (uvicorn believes 127.0.0.1):
    # all addresses together are limited too.
    for n in range(LOGIN_FAILURES_ALL):
        spoofed = {"X-Forwarded-For": f"10.0.{n // 256}.{n % 256}"}
        got = board.send("/login", method="POST", form=wrong, headers=spoofed)
        assert got.status == 401, (n, got.status)
    got = board.send("/login", method="POST", form={"token": TOKEN}, source="127.0.0.3")
    assert got.status == 429
    clock.advance(LOGIN_WINDOW)
    assert board.send("/login", method="POST", form={"token": TOKEN}).status == 303


def test_the_login_limit_remembers_a_bounded_number_of_addresses() -> None:
    """Guessing from ever more addresses must not grow the dashboard's memory."""
    clock = ManualClock()
    limit = LoginLimit(clock)
    for n in range(2 * LOGIN_ADDRESSES):
        limit.failed(f"10.{n >> 16}.{(n >> 8) & 255}.{n & 255}")
    assert len(limit) == LOGIN_ADDRESSES
    assert limit.wait("192.0.2.1") > 0, "all addresses together stay limited"
    clock.advance(LOGIN_WINDOW)
    assert limit.wait("192.0.2.1") == 0
