"""The dashboard's guard and serving, over real HTTP against a real `crawlq dashboard`
subprocess (and, where only a browser tells, in Chromium): one section a defect fixed."""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import http.server
import json
import math
import os
import re
import secrets
import shutil
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import pytest
from playwright.sync_api import expect, sync_playwright

from crawlq.backends import open_backend
from crawlq.cli.dashboard import allowed_hosts
from crawlq.observe.dashboard import LOOPBACK_HOSTS
from crawlq.observe.security import LOGIN_SECONDS, MAX_FORM_BYTES, TOKEN_COOKIE, Guard, cookies
from crawlq.types import Schedule

from ..conftest import backend_url
from .conftest import APP, ROOT, Reply, http_request
from .test_dashboard import CHROMIUM

TOKEN = "tok-" + secrets.token_urlsafe(18)


@dataclass
class Served:
    """A `crawlq dashboard` subprocess with TOKEN, on the backend at `url`."""

    process: subprocess.Popen[str]
    base: str
    url: str

    def request(
        self,
        path: str,
        *,
        data: bytes | None = None,
        headers: dict[str, str] | None = None,
        bearer: bool = True,
        timeout: float = 30,
    ) -> Reply:
        token = TOKEN if bearer else None
        return http_request(
            self.base + path, token=token, data=data, headers=headers, timeout=timeout
        )


Launch = Callable[..., Served]


@pytest.fixture
def launch(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Launch]:
    """Starts a dashboard (with TOKEN, no cache) on a backend of `kind` holding the queues
    `pages` and `held` (and, with `dead`, a dead letter in `pages`, left by a worker; `pages`
    more elements of it); extra arguments go to `crawlq dashboard`, `env` to its environment."""
    started: list[subprocess.Popen[str]] = []

    def start(
        *args: str,
        kind: str = "sqlite",
        env: dict[str, str] | None = None,
        dead: bool = False,
        pages: Iterable[str] = (),
    ) -> Served:
        url = backend_url(kind, tmp_path / kind, request)
        (tmp_path / kind).mkdir(exist_ok=True)
        environ = {k: v for k, v in os.environ.items() if not k.startswith("CRAWLQ_")}
        environ.pop("PROMETHEUS_MULTIPROC_DIR", None)
        environ.update(
            CRAWLQ_BACKEND=url,
            CRAWLQ_TEST_RECORD=str(tmp_path / "record.jsonl"),
            CRAWLQ_TEST_HEAL=str(tmp_path / "heal"),
            CRAWLQ_TEST_RELEASE=str(tmp_path / "release"),
            PYTHONPATH=os.pathsep.join([str(ROOT / "src"), str(ROOT)]),
            **(env or {}),
        )
        commands = [["schedule", "pages", '"http://a.test/ok/1"', "--app", APP]]
        commands += [["schedule", "held", "1", "--app", APP]]
        commands += [["schedule", "pages", page, "--app", APP] for page in pages]
        if dead:
            (tmp_path / "release").touch()  # held elements end at once
            commands += [["schedule", "pages", '"http://a.test/fail/1"', "--app", APP]]
            commands += [["worker", APP, "--burst"]]
        for command in commands:
            subprocess.run(
                [sys.executable, "-m", "crawlq", *command],
                env=environ,
                cwd=ROOT,
                check=True,
                capture_output=True,
                timeout=60,
            )
        with (tmp_path / "dashboard.log").open("a") as log:
            process = subprocess.Popen(
                [sys.executable, "-m", "crawlq", "dashboard", "--port", "0", "--cache", "0", *args],
                env={**environ, "CRAWLQ_DASHBOARD_TOKEN": TOKEN},
                cwd=ROOT,
                stdout=subprocess.PIPE,
                stderr=log,
                text=True,
            )
        started.append(process)
        assert process.stdout is not None
        line = process.stdout.readline()  # printed once the socket listens
        match = re.fullmatch(r"crawlq dashboard on (http://\S+?)/\n", line)
        assert match, (line, (tmp_path / "dashboard.log").read_text())
        return Served(process=process, base=match.group(1), url=url)

    try:
        yield start
    finally:
        for process in started:
            process.terminate()
            try:
                process.communicate(timeout=20)
            except subprocess.TimeoutExpired:
                process.kill()
                process.communicate()


# -- 1. the login cookie -----------------------------------------------------------------------


def test_the_login_cookie_holds_no_token_and_a_raw_token_cookie_no_longer_passes(
    launch: Launch,
) -> None:
    board = launch()
    logins = [
        board.request("/login", data=f"token={TOKEN}&next=/dead".encode(), bearer=False),
        board.request(f"/groups?q=a&token={TOKEN}", bearer=False),
    ]
    values = []
    for login in logins:
        assert login.status == 303
        set_cookie = login.cookie(TOKEN_COOKIE)
        assert set_cookie is not None
        assert TOKEN not in set_cookie, "the cookie of 127.0.0.1 goes to every port of it"
        attributes = {a.strip().lower() for a in set_cookie.split(";")[1:]}
        assert {"httponly", "samesite=strict", "path=/", f"max-age={LOGIN_SECONDS}"} <= attributes
        values.append(set_cookie.split(";", 1)[0].split("=", 1)[1])
    assert logins[0].headers["location"] == "/dead"
    assert logins[1].headers["location"] == "/groups?q=a"

    for value in values:
        assert board.request("/dead", headers={"Cookie": f"{TOKEN_COOKIE}={value}"}).status == 200
        page = board.request("/api/stats", headers={"Cookie": f"{TOKEN_COOKIE}={value}"})
        assert page.status == 200, "the login cookie authenticates"
        expiry, name, mac = value.split(".")
        forged = [
            f"{int(expiry) + 1}.{name}.{mac}",
            f"{expiry}.{name}.{mac[:-1]}{'0' if mac[-1] != '0' else '1'}",
            f"{expiry}.{name[:-1]}{'0' if name[-1] != '0' else '1'}.{mac}",
            f"{expiry}.{name}.",
            f"{expiry}.{mac}",
            expiry,
            f"{expiry}.{name}.{mac}é",
            f"{expiry}.{name}.{mac}.{mac}",
        ]
        for bad in forged:
            cookie = {"Cookie": f"{TOKEN_COOKIE}={bad}"}
            assert board.request("/", headers=cookie, bearer=False).status == 401, bad
    raw = {"Cookie": f"{TOKEN_COOKIE}={TOKEN}"}
    assert board.request("/", headers=raw, bearer=False).status == 401, "the old raw cookie"
    assert board.request("/api/stats", headers=raw, bearer=False).status == 401
    assert board.request("/api/stats").status == 200, "the Bearer header still passes"


def test_a_login_cookie_ends_with_its_expiry_and_its_dashboard() -> None:
    guard = Guard(TOKEN)
    assert guard.login_ok(guard.login_cookie())
    assert not guard.login_ok(guard.login_cookie(lifetime=-1)), "expired"
    assert not Guard(TOKEN).login_ok(guard.login_cookie()), "another dashboard's (a restart)"
    assert not guard.login_ok(TOKEN) and not guard.login_ok(None) and not guard.login_ok("")


# -- 2. framing ------------------------------------------------------------------------------


def test_no_response_may_be_framed(launch: Launch) -> None:
    board = launch()
    port = board.base.rsplit(":", 1)[1]
    replies = {
        "page": board.request("/dead?queue=pages"),
        "fragment": board.request("/?fragment=1"),
        "static": board.request("/static/dashboard.js"),
        "metrics": board.request("/metrics"),
        "login form": board.request("/", bearer=False),
        "login": board.request("/login", data=f"token={TOKEN}".encode(), bearer=False),
        "confirm": board.request("/dead/purge", data=b"queue=pages&all=1&csrf=x"),
        "not found": board.request("/no/such/page"),
        "other host": board.request("/", headers={"Host": f"evil.test:{port}"}),
    }
    assert [r.status for r in replies.values()] == [200, 200, 200, 200, 401, 303, 403, 404, 400]
    for name, reply in replies.items():
        assert reply.headers["x-frame-options"] == "DENY", name
        policy = reply.headers["content-security-policy"]
        assert "frame-ancestors 'none'" in policy and "default-src 'self'" in policy, name
    page = replies["page"].body
    assert '<script src="/static/dashboard.js"' in page, "the script the policy allows"
    assert not re.search(r"<script>|<style|\sstyle=|\son[a-z]+=", page), "nothing inline"


def test_in_chromium_another_port_gets_no_token_and_cannot_frame_the_dashboard(
    launch: Launch,
) -> None:
    """The reviewer's case: a browser logged in to the dashboard opens another local service
    (same site: 127.0.0.1, another port), which reads the cookies it is sent and frames /dead."""
    board = launch(dead=True)
    seen: list[str] = []
    frame = f'<iframe id="f" src="{board.base}/dead?queue=pages" width=900 height=600></iframe>'

    class Other(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            seen.append(self.headers.get("Cookie") or "")
            body = f"<!doctype html><h1>win a prize</h1>{frame}".encode()
            self.send_response(200)
            self.send_header("content-type", "text/html")
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    other = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Other)
    threading.Thread(target=other.serve_forever, daemon=True).start()
    os.environ.setdefault("PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD", "1")
    try:
        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path=CHROMIUM, headless=True)
            try:
                page = browser.new_page()
                console: list[str] = []
                page.on("console", lambda message: console.append(message.text))
                page.goto(f"{board.base}/dead?queue=pages&token={TOKEN}")
                expect(page.locator("#updated")).to_contain_text("live", timeout=15_000)
                refused = [text for text in console if "Content Security Policy" in text]
                assert refused == [], "the page's own script and style pass the policy"
                page.goto(f"http://127.0.0.1:{other.server_address[1]}/")
                framed = page.frame_locator("#f").locator("text=Purge all of pages")
                page.wait_for_timeout(500)
                assert framed.count() == 0, "the dashboard refuses to be framed"
            finally:
                browser.close()
    finally:
        other.shutdown()
        other.server_close()
    assert seen and all(TOKEN_COOKIE in cookie for cookie in seen), seen
    assert not any(TOKEN in cookie for cookie in seen), "another port got the token"


# -- 3. cookies ------------------------------------------------------------------------------


def test_cookies_are_read_pair_by_pair() -> None:
    ours = f"{TOKEN_COOKIE}=1.ab; crawlq_session={'1' * 32}"
    for other in ['ajs_user={"id":1}', "x=a b", "pref=[1,2]", "a=b\\c", 'g_state={"i_l":0}']:
        for header in (f"{other}; {ours}", f"{ours}; {other}"):
            jar = cookies({"headers": [(b"cookie", header.encode())]})
            assert jar[TOKEN_COOKIE] == "1.ab" and jar["crawlq_session"] == "1" * 32, header
    two = {"headers": [(b"cookie", b"a=1"), (b"cookie", f"{TOKEN_COOKIE}=2.cd".encode())]}
    assert cookies(two) == {"a": "1", TOKEN_COOKIE: "2.cd"}


def test_a_cookie_another_app_set_breaks_neither_actions_nor_the_login(launch: Launch) -> None:
    board = launch(dead=True)
    other = 'ajs_user={"id":1}'
    session = "crawlq_session=" + "4" * 32
    page = board.request("/dead?queue=pages", headers={"Cookie": f"{other}; {session}"})
    csrf = re.search(r'name="csrf" value="([0-9a-f]{64})"', page.body)
    assert page.status == 200 and csrf is not None
    assert page.cookie("crawlq_session") is None, "the session cookie was read"
    form = f"queue=pages&key=%22nope%22&csrf={csrf.group(1)}".encode()  # the confirm page only
    for cookie in (session, f"{other}; {session}", f"{session}; {other}"):
        reply = board.request("/dead/requeue", data=form, headers={"Cookie": cookie})
        assert reply.status == 200 and "Re-queue?" in reply.body, cookie

    login = board.request("/login", data=f"token={TOKEN}".encode(), bearer=False)
    set_cookie = login.cookie(TOKEN_COOKIE)
    assert set_cookie is not None
    value = set_cookie.split(";", 1)[0]
    for cookie in (value, f"{other}; {value}", f"{value}; x=a b; {other}"):
        assert board.request("/", headers={"Cookie": cookie}, bearer=False).status == 200, cookie


# -- 4. /metrics off the event loop ------------------------------------------------------------

_FILL = """
import sys
from prometheus_client import values
from crawlq.observe import metrics
values.ValueClass = values.MultiProcessValue(lambda: 1)
wm = metrics.worker_metrics.__wrapped__()
for q in range(5):
    wm.started(f"queue{q}", 0.1)
    for outcome in ("done", "retry", "dead"):
        wm.finished(f"queue{q}", outcome, 0.2)
for status in range(200, 220):
    wm.record_fetch(status, 100)
"""


@contextlib.contextmanager
def held_alive(folder: Path, pids: Iterable[int]) -> Iterator[None]:
    """The pids' alive locks held (see crawlq.observe.metrics), as their processes would."""
    with contextlib.ExitStack() as held:
        for pid in pids:
            lock = held.enter_context((folder / f"alive_{pid}.lock").open("w"))
            fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def test_a_slow_metrics_merge_blocks_no_other_page(launch: Launch, tmp_path: Path) -> None:
    # The files of many live worker processes: one written by a real prometheus-client, copied
    # as if by other pids.
    prom = tmp_path / "prom"
    prom.mkdir()
    env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(prom), "PYTHONPATH": str(ROOT / "src")}
    subprocess.run([sys.executable, "-c", _FILL], env=env, check=True, timeout=60)
    written = sorted(prom.glob("*_1.db"))
    assert written
    for pid in range(2, 1200):
        for path in written:
            shutil.copyfile(path, prom / path.name.replace("_1.db", f"_{pid}.db"))
    with held_alive(prom, range(1, 1200)):
        _merge_meanwhile(launch(env={"PROMETHEUS_MULTIPROC_DIR": str(prom)}))


def _merge_meanwhile(board: Served) -> None:
    started = time.monotonic()
    scraped = board.request("/metrics", timeout=120)
    merge = time.monotonic() - started
    assert scraped.status == 200 and "crawlq_tasks_total" in scraped.body
    assert merge > 0.5, f"a merge this quick ({merge:.2f}s) shows nothing: more files"

    scrapes: list[int] = []

    def scrape() -> None:
        for _ in range(2):
            scrapes.append(board.request("/metrics", timeout=120).status)

    scraper = threading.Thread(target=scrape)
    scraper.start()
    try:
        waits: list[float] = []
        while scraper.is_alive() and len(waits) < 40:
            started = time.monotonic()
            assert board.request("/api/stats", timeout=120).status == 200
            waits.append(time.monotonic() - started)
            time.sleep(0.02)
    finally:
        scraper.join()
    assert scrapes == [200, 200]
    waits.sort()
    assert len(waits) >= 5, f"pages were served {len(waits)} times while /metrics merged"
    assert waits[len(waits) // 2] < merge / 3, (merge, waits)


# -- 5. offsets --------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["sqlite", "redis"])
def test_a_huge_dead_letter_offset_is_no_error(launch: Launch, kind: str) -> None:
    board = launch(kind=kind)
    for offset in ("99999999999999999999", str(2**63), str(2**63 - 1), "-99999999999999999999"):
        for path in (
            f"/dead?queue=pages&offset={offset}",
            f"/dead?offset={offset}&queue=pages&fragment=1",
        ):
            reply = board.request(path)
            assert reply.status == 200, (path, reply.body[-300:])
            assert "No dead elements in pages" in reply.body, path


# -- 6. another loopback address ----------------------------------------------------------------


def test_a_dashboard_on_127_0_0_2_answers_its_own_address(launch: Launch) -> None:
    board = launch("--host", "127.0.0.2")
    assert board.base.startswith("http://127.0.0.2:")
    port = board.base.rsplit(":", 1)[1]
    assert board.request("/").status == 200
    assert board.request("/", headers={"Host": "127.0.0.2"}).status == 200
    assert board.request("/", headers={"Host": f"localhost:{port}"}).status == 200
    assert board.request("/", headers={"Host": f"evil.test:{port}"}).status == 400, "rebinding"
    assert board.request("/", headers={"Host": f"127.0.0.3:{port}"}).status == 400


def test_the_allowed_hosts_are_the_loopback_names_and_the_bound_address() -> None:
    assert allowed_hosts("127.0.0.1", LOOPBACK_HOSTS) == LOOPBACK_HOSTS
    assert allowed_hosts("127.0.0.2", LOOPBACK_HOSTS) == [*LOOPBACK_HOSTS, "127.0.0.2"]
    assert allowed_hosts("[::1]", LOOPBACK_HOSTS) == LOOPBACK_HOSTS
    assert allowed_hosts("localhost", LOOPBACK_HOSTS) == LOOPBACK_HOSTS
    assert allowed_hosts("0.0.0.0", LOOPBACK_HOSTS) is None, "off loopback the token guards it"
    assert allowed_hosts("192.0.2.1", LOOPBACK_HOSTS) is None


# -- 7. logging out ----------------------------------------------------------------------------

SESSION = "crawlq_session=" + "5" * 32


def test_logging_out_needs_the_csrf_token_and_ends_the_login(launch: Launch) -> None:
    board = launch()
    login = board.request("/login", data=f"token={TOKEN}".encode(), bearer=False)
    set_cookie = login.cookie(TOKEN_COOKIE)
    assert login.status == 303 and set_cookie is not None
    logged_in = {"Cookie": f"{set_cookie.split(';', 1)[0]}; {SESSION}"}
    page = board.request("/", headers=logged_in, bearer=False)
    form = re.search(r'<form method="post" action="/logout">.*?</form>', page.body, re.S)
    csrf = re.search(r'name="csrf" value="([0-9a-f]{64})"', form.group(0) if form else "")
    assert page.status == 200 and csrf is not None, "a logout button on every page"

    for refused, headers in [
        (b"", logged_in),
        (b"csrf=" + b"0" * 64, logged_in),
        (f"csrf={csrf.group(1)}".encode(), {**logged_in, "Origin": "http://evil.test"}),
    ]:
        reply = board.request("/logout", data=refused, headers=headers, bearer=False)
        assert reply.status == 403 and reply.cookie(TOKEN_COOKIE) is None, refused
    assert board.request("/", headers=logged_in, bearer=False).status == 200, "still logged in"

    out = board.request(
        "/logout", data=f"csrf={csrf.group(1)}".encode(), headers=logged_in, bearer=False
    )
    assert out.status == 303 and out.headers["location"] == "/"
    cleared = out.cookie(TOKEN_COOKIE)
    assert cleared is not None and cleared.startswith(f"{TOKEN_COOKIE}=;"), cleared
    assert "Max-Age=0" in cleared and "HttpOnly" in cleared
    assert board.request("/", headers=logged_in, bearer=False).status == 401, "a copy is void"
    again = board.request("/login", data=f"token={TOKEN}".encode(), bearer=False)
    cookie = again.cookie(TOKEN_COOKIE)
    assert cookie is not None
    renewed = {"Cookie": cookie.split(";", 1)[0]}
    assert board.request("/", headers=renewed, bearer=False).status == 200


def test_the_logout_button_in_chromium(launch: Launch) -> None:
    board = launch()
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, headless=True)
        try:
            page = browser.new_page()
            page.goto(f"{board.base}/groups?token={TOKEN}")
            page.get_by_role("button", name="Log out").click()
            expect(page.get_by_text("needs its access token")).to_be_visible()
            assert page.url == f"{board.base}/"
            assert not [c for c in page.context.cookies() if c["name"] == TOKEN_COOKIE]
            page.goto(f"{board.base}/groups")
            expect(page.get_by_text("needs its access token")).to_be_visible()
        finally:
            browser.close()


def test_logging_out_ends_that_login_only() -> None:
    guard = Guard(TOKEN)
    first, second = guard.login_cookie(), guard.login_cookie()
    guard.log_out(first)
    guard.log_out("not.a.login")
    guard.log_out(None)
    assert not guard.login_ok(first) and guard.login_ok(second)


# -- 8. a form too large -----------------------------------------------------------------------


def test_an_action_too_large_is_refused_before_its_whole_body_comes(launch: Launch) -> None:
    """A body that says it holds a gigabyte: refused once MAX_FORM_BYTES of it came, not held
    in memory to its end (without a token, any web page can post one to 127.0.0.1)."""
    board = launch()
    host, port = board.base.removeprefix("http://").rsplit(":", 1)
    head = (
        f"POST /dead/requeue HTTP/1.1\r\nHost: {host}:{port}\r\n"
        f"Authorization: Bearer {TOKEN}\r\nContent-Type: application/x-www-form-urlencoded\r\n"
        f"Content-Length: {10**9}\r\n\r\n"
    )
    with socket.create_connection((host, int(port)), timeout=30) as sock:
        sock.sendall(head.encode() + b"a" * (MAX_FORM_BYTES + 1))
        try:
            answer = sock.recv(200)
        except TimeoutError:
            answer = b"(no answer: the dashboard waits for the rest of the gigabyte)"
    assert answer.startswith(b"HTTP/1.1 413 "), answer


# -- 9. group searches ---------------------------------------------------------------------------


def test_a_group_search_that_would_hold_up_redis_is_refused(launch: Launch) -> None:
    """Redis matches a group search by backtracking (a Lua pattern): *?*?*?*?*?*?*?*?# takes
    seconds over one 45-character group name, a few more ?* minutes, and Redis serves no
    worker meanwhile. Without a token, any web page can make a browser load the search."""
    host = "a" * 40 + ".test"
    board = launch(kind="redis", pages=[f'"http://{host}/1"'])
    for search in ("*.test", "aaa", "aaa*", "*aaa*", "*a**"):
        found = board.request("/groups?" + urlencode({"q": search}))
        assert found.status == 200 and f'data-group="{host}"' in found.body, search
    for search in ("*?" * 8 + "#", "*a*b", "**a**a**"):
        for path in ("/groups?", "/groups?fragment=1&"):
            refused = board.request(path + urlencode({"q": search}))
            assert refused.status == 400, (search, refused.status)
            assert "a search may hold one * before its end" in refused.body


# -- 10. where a login leads -------------------------------------------------------------------


def test_a_login_leads_to_a_page_of_this_dashboard_only(launch: Launch) -> None:
    """Location is the login's `next` or the page asked with ?token=: never another host (a
    browser reads /\\evil.test, and / TAB /evil.test, as //evil.test), never a broken header
    (CR LF in it made a 500 and a dropped connection)."""
    board = launch()
    for target, location in [
        ("/dead?queue=pages", "/dead?queue=pages"),
        ("/\\evil.test", "/%5Cevil.test"),
        ("/\t/evil.test", "/%09/evil.test"),
        ("/\r\nSet-Cookie: a=1", "/%0D%0ASet-Cookie:%20a=1"),
        ("/é", "/%C3%A9"),
        ("//evil.test", "/"),
        ("https://evil.test", "/"),
    ]:
        form = urlencode({"token": TOKEN, "next": target}).encode()
        login = board.request("/login", data=form, bearer=False)
        assert (login.status, login.headers["location"]) == (303, location), target
    for path, location in [
        ("//evil.test/?token=", "/"),
        ("/dead%0D%0ASet-Cookie:%20a=1?token=", "/dead%0D%0ASet-Cookie:%20a=1"),
        ("/groups?q=%C3%A9&token=", "/groups?q=%C3%A9"),
    ]:
        login = board.request(path + TOKEN, bearer=False)
        assert (login.status, login.headers["location"]) == (303, location), path


# -- 11. cookies over HTTPS --------------------------------------------------------------------


def test_behind_an_https_proxy_the_cookies_are_secure(launch: Launch) -> None:
    """uvicorn takes X-Forwarded-Proto from a proxy on 127.0.0.1: a page served over HTTPS
    sets its cookies Secure, so a browser never sends them over plain HTTP; a page served
    over HTTP cannot (the browser would drop them)."""
    board = launch()
    for proto, secure in (("https", True), ("http", False)):
        forwarded = {"X-Forwarded-Proto": proto}
        page = board.request("/", headers=forwarded)
        login = board.request("/login", data=f"token={TOKEN}".encode(), headers=forwarded)
        session = {"Cookie": "crawlq_session=" + "6" * 32, **forwarded}
        dead = board.request("/dead?queue=pages", headers=session)
        csrf = re.search(r'name="csrf" value="([0-9a-f]{64})"', dead.body)
        assert csrf is not None
        out = board.request("/logout", data=f"csrf={csrf.group(1)}".encode(), headers=session)
        cookies = [
            page.cookie("crawlq_session"),
            login.cookie(TOKEN_COOKIE),
            out.cookie(TOKEN_COOKIE),
            out.cookie("crawlq_session"),
        ]
        for cookie in cookies:
            assert cookie is not None
            assert ("secure" in cookie.lower().split("; ")) is secure, (proto, cookie)


# -- 12. times beyond the calendar ---------------------------------------------------------------


async def _block_for_good_and_schedule_far(url: str) -> None:
    backend = open_backend(url, create=False)
    await backend.open()
    try:
        await backend.block_group("forever.test", math.inf, "blocked for good")
        far = Schedule(queue="pages", key='"far"', payload='"far"', group="far.test", due=1e300)
        await backend.schedule([far])
    finally:
        await backend.close()


def test_a_group_blocked_for_good_and_an_element_due_far_ahead_are_shown(
    launch: Launch,
) -> None:
    """A backend takes a block until infinity (for good) and any finite due time; the pages
    showed them with time.localtime, which cannot (a 500 for the groups page, the element's
    page and /api/stats)."""
    board = launch(pages=['"http://forever.test/1"'])
    asyncio.run(_block_for_good_and_schedule_far(board.url))
    groups = board.request("/groups")
    assert groups.status == 200, groups.body
    row = re.search(r'<tr data-group="forever.test">.*?</tr>', groups.body, re.S)
    assert row is not None and "far future" in row.group(0) and "blocked for good" in row.group(0)
    element = board.request("/element?" + urlencode({"queue": "pages", "key": '"far"'}))
    assert element.status == 200 and "far future" in element.body, element.body
    stats = board.request("/api/stats")
    assert stats.status == 200, stats.body
    blocked = {g["name"]: g for g in json.loads(stats.body)["groups"]}
    assert blocked["forever.test"]["blocked_for_good"] is True, "standard JSON, no Infinity"
    assert blocked["forever.test"]["blocked_until"] is None


# -- 13. a range that holds nothing ------------------------------------------------------------


@pytest.mark.parametrize("kind", ["sqlite", "redis"])
def test_a_group_search_with_an_empty_range_matches_as_fnmatch_does(
    launch: Launch, kind: str
) -> None:
    """[z-a] holds no character (fnmatch drops a range whose ends are the wrong way round):
    on Redis it became the Lua pattern [], which Lua refuses, so the groups page gave 500."""
    board = launch(kind=kind)
    for search, found in [("[z-a]*", False), ("*[z-a]", False), ("[!z-a]*", True)]:
        page = board.request("/groups?" + urlencode({"q": search}))
        assert page.status == 200, (search, page.status)
        assert ('data-group="a.test"' in page.body) is found, search
