"""A running board: a real worker (`crawlq worker tests.dashboard.board_app:app`) and a real
`crawlq dashboard` with a token, both subprocesses on one backend (SQLite file or the session's
redis-server), sharing a prometheus-client multi-process folder."""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from email.message import Message
from pathlib import Path
from typing import Any

import pytest

from ..conftest import backend_url

ROOT = Path(__file__).resolve().parents[2]
APP = "tests.dashboard.board_app:app"
SCREENSHOTS = ROOT / "artifacts" / "screenshots"
TIMEOUT = 30.0
WORKER_OPTIONS = ("--log-level", "info", "--log-format", "json", "--grace", "1")


def settled(pages: dict[str, Any]) -> bool:
    """Every page ended: 3 dead, the rest acknowledged (a record is written before its ack)."""
    return bool(pages["dead"] == 3 and pages["due"] == pages["delayed"] == pages["running"] == 0)


def wait_for(check: Callable[[], Any], what: str, timeout: float = TIMEOUT) -> Any:
    """Polls `check` until it returns something truthy; fails with `what` after `timeout`."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        last = check()
        if last:
            return last
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout}s waiting for {what} (last: {last!r})")


@dataclass
class Board:
    kind: str
    url: str
    home: Path
    token: str
    env: dict[str, str]
    base: str = ""
    processes: dict[str, subprocess.Popen[str]] = field(default_factory=dict)

    @property
    def record(self) -> Path:
        return self.home / "record.jsonl"

    @property
    def worker_log(self) -> Path:
        return self.home / "worker.log"

    def crawlq(self, *args: str, check: bool = True) -> str:
        ran = subprocess.run(
            [sys.executable, "-m", "crawlq", *args],
            env=self.env,
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=60,
        )
        if check and ran.returncode != 0:
            raise AssertionError(f"crawlq {' '.join(args)} failed: {ran.stdout}{ran.stderr}")
        return ran.stdout

    def schedule(self, queue: str, *elements: str) -> None:
        self.crawlq("schedule", queue, *elements, "--app", APP)

    def stats(self) -> dict[str, Any]:
        found: dict[str, Any] = json.loads(self.crawlq("stats", "--json", "--groups", "200"))
        return found

    def queue(self, name: str) -> dict[str, Any]:
        return next(
            (q for q in self.stats()["queues"] if q["name"] == name),
            {"name": name, "total": 0, "due": 0, "delayed": 0, "running": 0, "dead": 0},
        )

    def records(self, queue: str) -> list[Any]:
        if not self.record.exists():
            return []
        lines = self.record.read_text().splitlines()
        return [e["element"] for e in map(json.loads, lines) if e["queue"] == queue]

    def request(
        self,
        path: str,
        *,
        data: bytes | None = None,
        headers: dict[str, str] | None = None,
        bearer: bool = True,
    ) -> tuple[int, str]:
        """An HTTP request to the dashboard: (status, body), never a redirect followed."""
        reply = http_request(
            self.base + path, token=self.token if bearer else None, data=data, headers=headers
        )
        return reply.status, reply.body

    def start_worker(self) -> subprocess.Popen[str]:
        with self.worker_log.open("a") as log:
            worker = subprocess.Popen(
                [sys.executable, "-m", "crawlq", "worker", APP, *WORKER_OPTIONS],
                env=self.env,
                cwd=ROOT,
                stdout=log,
                stderr=log,
                text=True,
            )
        self.processes["worker"] = worker
        return worker

    def start_dashboard(self) -> None:
        with (self.home / "dashboard.log").open("a") as log:
            dashboard = subprocess.Popen(
                [sys.executable, "-m", "crawlq", "dashboard", "--port", "0"],
                env={**self.env, "CRAWLQ_DASHBOARD_TOKEN": self.token},
                cwd=ROOT,
                stdout=subprocess.PIPE,
                stderr=log,
                text=True,
            )
        self.processes["dashboard"] = dashboard
        assert dashboard.stdout is not None
        line = dashboard.stdout.readline()  # printed once the socket listens
        assert line.startswith("crawlq dashboard on http://"), line
        self.base = line.split()[-1].rstrip("/")

    def stop(self) -> None:
        (self.home / "release").touch()
        for name in ("dashboard", "worker"):
            process = self.processes.pop(name, None)
            if process is None:
                continue
            process.terminate()
            try:
                process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(timeout=10)
            if process.stdout is not None:
                process.stdout.close()


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


def http_request(
    url: str,
    *,
    token: str | None,
    data: bytes | None = None,
    headers: dict[str, str] | None = None,
    timeout: float = 30,
) -> Reply:
    """An HTTP request to a dashboard, with `token` as its bearer unless the headers carry
    an Authorization of their own; never a redirect followed."""
    sent = dict(headers or {})
    if token is not None:
        sent.setdefault("Authorization", f"Bearer {token}")
    request = urllib.request.Request(url, data=data, headers=sent)
    try:
        with urllib.request.build_opener(_NoRedirect).open(request, timeout=timeout) as got:
            return Reply(got.status, got.read().decode(), got.headers)
    except urllib.error.HTTPError as exc:
        return Reply(exc.code, exc.read().decode(), exc.headers)


@pytest.fixture(params=["sqlite", "redis"])
def board(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Board]:
    url = backend_url(request.param, tmp_path, request)
    (tmp_path / "prom").mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith("CRAWLQ_")}
    env.update(
        CRAWLQ_BACKEND=url,
        CRAWLQ_TEST_RECORD=str(tmp_path / "record.jsonl"),
        CRAWLQ_TEST_HEAL=str(tmp_path / "heal"),
        CRAWLQ_TEST_RELEASE=str(tmp_path / "release"),
        PROMETHEUS_MULTIPROC_DIR=str(tmp_path / "prom"),
        PYTHONPATH=os.pathsep.join([str(ROOT / "src"), str(ROOT)]),  # this checkout's crawlq
        COLUMNS="200",
    )
    made = Board(
        kind=request.param, url=url, home=tmp_path, token=secrets.token_urlsafe(16), env=env
    )
    try:
        # The queues exist before the dashboard opens the backend (it never creates one).
        made.schedule("pages", '"http://a.test/fail/1"', '"http://a.test/fail/2"')
        made.schedule("pages", '"http://a.test/fail/3"', '"http://a.test/ok/1"')
        made.schedule("pages", '"http://b.test/ok/2"')
        made.schedule("held", "1", "2")
        made.start_worker()
        made.start_dashboard()
        wait_for(
            lambda: settled(made.queue("pages")) and made.queue("held")["running"] == 2,
            "3 dead pages, the 2 good ones acknowledged, and 2 held elements running",
        )
        yield made
    finally:
        made.stop()
