"""No credential reaches a log line or a dead letter: not the backend's password, not one a
task's exception quotes (a URL's userinfo, an Authorization header), not the userinfo of the
element's own URL. On SQLite and on a Redis that wants a password."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import sqlite3
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

import crawlq
from crawlq import App, Context, Retry
from crawlq.observe.logs import JsonFormatter, TextFormatter
from crawlq.testing.redis_server import RedisServer
from crawlq.types import Failure

REDIS_PASSWORD = "redis-pw-6c1d0e"
URL_PASSWORD = "url-pw-93ab1f"
BEARER = "bearer-tok-5e77c2"
ELEMENT = f"http://ann:{URL_PASSWORD}@a.test/report?id=7"
GUARD = 60.0  # seconds: only a failing test waits this long


@pytest.fixture(scope="module")
def secured_redis() -> Iterator[RedisServer]:
    server = RedisServer(password=REDIS_PASSWORD)
    server.start()
    try:
        yield server
    finally:
        server.remove()


@pytest.fixture(params=["sqlite", "redis"])
def backend_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'queue.db'}"
    server: RedisServer = request.getfixturevalue("secured_redis")
    assert REDIS_PASSWORD in server.url
    return f"{server.url}?namespace=secrets-{uuid.uuid4().hex[:12]}"


def failing_app(url: str) -> App:
    """One task that logs its element and fails quoting the backend's URL and a header, the
    way a client library's error does, under an error of its own."""
    app = App(url)

    @app.task(queue="reports", retry=Retry(max_attempts=1))
    async def report(ctx: Context, element: str) -> None:
        ctx.log.info("fetching %s", element)
        try:
            raise ConnectionError(f"lost {url} (sent Authorization: Bearer {BEARER})")
        except ConnectionError as exc:
            raise RuntimeError(f"gave up on {element}: {exc}") from exc

    return app


async def run_failing(app: App) -> None:
    try:
        await app.aschedule("reports", ELEMENT)
        worker = crawlq.Worker(app, burst=True, burst_horizon=5)
        stats = await asyncio.wait_for(worker.run(), GUARD)
    finally:
        await app.aclose()
    assert stats.dead == 1


def secrets_in(text: str) -> list[str]:
    return [s for s in (REDIS_PASSWORD, URL_PASSWORD, BEARER) if s in text]


async def test_log_records_of_a_failing_task_hold_no_credential(
    backend_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The records themselves, as a handler of the program running crawlq gets them, and the
    lines crawlq's formatters make of them (the task's key field included)."""
    caplog.set_level(logging.DEBUG)
    await run_failing(failing_app(backend_url))
    records = [r for r in caplog.records if r.name.startswith("crawlq")]
    messages = "\n".join(r.getMessage() for r in records)
    assert "fetching http://***@a.test/report" in messages
    assert "reports failed: RuntimeError: gave up" in messages
    for formatter in (TextFormatter(), JsonFormatter()):
        for record in records:
            line = formatter.format(record)
            assert secrets_in(line) == [], line
    keys = [str(getattr(r, "key", "")) for r in records]
    assert any("***@a.test" in key for key in keys)
    assert secrets_in(messages + "\n".join(keys)) == []
    assert secrets_in(caplog.text) == []


async def test_a_dead_letter_keeps_no_credential_in_its_error_or_traceback(
    backend_url: str,
) -> None:
    """`crawlq dead list --json` prints a dead letter's error and traceback as stored: they
    were stored masked. The payload stays exact (requeueing needs it)."""
    await run_failing(failing_app(backend_url))
    listed = subprocess.run(
        [sys.executable, "-m", "crawlq", "dead", "list", "reports", "--json"],
        env={**os.environ, "CRAWLQ_BACKEND": backend_url},
        capture_output=True,
        text=True,
        timeout=GUARD,
        check=True,
    )
    (letter,) = json.loads(listed.stdout)
    assert json.loads(letter["payload"]) == ELEMENT
    assert "ConnectionError: lost" in letter["traceback"]
    assert "Authorization: Bearer ***" in letter["traceback"]
    assert secrets_in(letter["error"] + letter["traceback"]) == []
    assert secrets_in(listed.stderr) == []


def test_crawlq_check_names_a_broken_element_without_its_credentials(tmp_path: Path) -> None:
    """A broken invariant is reported with the element's key, which quotes its URL."""
    url = f"sqlite:///{tmp_path / 'queue.db'}"

    async def fill() -> None:
        app = App(url)
        app.task(queue="reports")(report_task)
        try:
            await app.aschedule("reports", ELEMENT)
        finally:
            await app.aclose()

    asyncio.run(fill())
    db = sqlite3.connect(tmp_path / "queue.db")
    try:
        with db:  # a lease on a queued element
            assert db.execute("UPDATE elements SET lease_until = 1").rowcount == 1
    finally:
        db.close()
    checked = subprocess.run(
        [sys.executable, "-m", "crawlq", "check"],
        env={**os.environ, "CRAWLQ_BACKEND": url},
        capture_output=True,
        text=True,
        timeout=GUARD,
    )
    assert checked.returncode == 1, checked.stderr
    assert "http://***@a.test/report?id=7" in checked.stdout
    assert "lease disagree" in checked.stdout
    assert secrets_in(checked.stdout + checked.stderr) == []


async def report_task(ctx: Context, element: str) -> None:
    pass


async def test_a_dead_letter_stored_unmasked_is_read_masked(backend_url: str) -> None:
    """Letters stored before workers masked them (or by a program of its own calling
    `fail`) hold what the task raised: the backends mask them as they read them."""
    app = App(backend_url)
    app.task(queue="reports", retry=Retry(max_attempts=1))(report_task)
    try:
        await app.aschedule("reports", ELEMENT)
        backend = await app.backend()
        claimed = (await backend.claim(["reports"], worker="old", limit=1, lease=60)).elements
        raw = f"lost {backend_url} (sent Authorization: Bearer {BEARER})"
        await backend.fail([Failure(element=claimed[0], error=raw, traceback=raw)])
        (letter,) = await backend.dead_letters("reports")
        found = await backend.element("reports", claimed[0].key)
    finally:
        await app.aclose()
    assert letter.error == letter.traceback
    assert "Authorization: Bearer ***" in letter.error
    assert secrets_in(letter.error) == []
    assert found is not None and found.dead is not None and found.dead.error == letter.error
