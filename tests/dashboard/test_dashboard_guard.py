"""The dashboard's guard and serving, over real HTTP against a real `crawlq dashboard`
subprocess (and, where only a browser tells, in Chromium): one section a defect fixed."""

from __future__ import annotations

import os
import re
import secrets
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from email.message import Message
from pathlib import Path
from typing import Any

import pytest

from crawlq.observe.security import LOGIN_SECONDS, TOKEN_COOKIE, Guard

from ..conftest import backend_url
from .conftest import APP, ROOT

TOKEN = "tok-" + secrets.token_urlsafe(18)


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None


@dataclass
class Reply:
    status: int
    body: str
    headers: Message

    def cookie(self, name: str) -> str | None:
        """The Set-Cookie header that sets `name`, whole (with its attributes)."""
        found = [c for c in self.headers.get_all("set-cookie") or [] if c.startswith(f"{name}=")]
        return found[-1] if found else None


@dataclass
class Served:
    """A `crawlq dashboard` subprocess with TOKEN."""

    process: subprocess.Popen[str]
    base: str

    def request(
        self,
        path: str,
        *,
        data: bytes | None = None,
        headers: dict[str, str] | None = None,
        bearer: bool = True,
        timeout: float = 30,
    ) -> Reply:
        sent = dict(headers or {})
        if bearer:
            sent.setdefault("Authorization", f"Bearer {TOKEN}")
        request = urllib.request.Request(self.base + path, data=data, headers=sent)
        try:
            with urllib.request.build_opener(_NoRedirect).open(request, timeout=timeout) as got:
                return Reply(got.status, got.read().decode(), got.headers)
        except urllib.error.HTTPError as exc:
            return Reply(exc.code, exc.read().decode(), exc.headers)


Launch = Callable[..., Served]


@pytest.fixture
def launch(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Launch]:
    """Starts a dashboard (with TOKEN, no cache) on a backend of `kind` holding the queues
    `pages` and `held` (and, with `dead`, a dead letter in `pages`, left by a worker); extra
    arguments go to `crawlq dashboard`, `env` to its environment."""
    started: list[subprocess.Popen[str]] = []

    def start(
        *args: str, kind: str = "sqlite", env: dict[str, str] | None = None, dead: bool = False
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
        return Served(process=process, base=match.group(1))

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
        expiry, mac = value.split(".")
        forged = [
            f"{int(expiry) + 1}.{mac}",
            f"{expiry}.{mac[:-1]}{'0' if mac[-1] != '0' else '1'}",
            f"{expiry}.",
            expiry,
            f"{expiry}.{mac}é",
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
