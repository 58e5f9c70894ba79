"""A worker's heartbeats and claims through a Redis outage: one WARNING line for each as they
start failing and one line once they succeed again, not a line or a traceback at each try;
other errors keep theirs. A
real redis-server, killed or stopped (SIGSTOP) under a running worker, then back."""

from __future__ import annotations

import asyncio
import functools
import logging
import re
from collections.abc import Callable, Iterator

import pytest
import redis

from crawlq import App, Context
from crawlq.backends.redis import backend as backend_module
from crawlq.backends.redis import lanes
from crawlq.testing.redis_server import RedisServer
from crawlq.worker import Worker, WorkerStats, runner

from .test_redis_connections import server

__all__ = ["server"]  # test_redis_connections' fixture (AOF, fsync always), used here too

GUARD = 60.0  # seconds: only a failing test waits this long
FAILED_BEATS = 3  # failed heartbeats seen before Redis comes back


class Records(logging.Handler):
    """The records of crawlq's loggers, and a wait for the first time a condition holds on
    them (checked as each record comes: the worker logs on this event loop)."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []
        self._waits: list[tuple[Callable[[], bool], asyncio.Event]] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)
        for condition, event in self._waits:
            if condition():
                event.set()

    async def until(self, condition: Callable[[], bool], what: str) -> None:
        event = asyncio.Event()
        if not condition():
            self._waits.append((condition, event))
            try:
                async with asyncio.timeout(GUARD):
                    await event.wait()
            except TimeoutError:
                raise AssertionError(f"never logged: {what}") from None
            finally:
                self._waits.remove((condition, event))

    def about_beats(self) -> list[logging.LogRecord]:
        return [r for r in self.records if "heartbeat" in r.getMessage()]

    def failed_beats(self) -> list[logging.LogRecord]:
        return [r for r in self.about_beats() if "failed" in r.getMessage()]

    def logged(self, text: str) -> bool:
        return any(text in r.getMessage() for r in self.records)

    def failed_claims(self) -> list[logging.LogRecord]:
        return [r for r in self.records if "claim failed" in r.getMessage()]


@pytest.fixture
def records() -> Iterator[Records]:
    handler = Records()
    crawlq = logging.getLogger("crawlq")
    level = crawlq.level
    crawlq.addHandler(handler)
    crawlq.setLevel(logging.DEBUG)
    try:
        yield handler
    finally:
        crawlq.removeHandler(handler)
        crawlq.setLevel(level)


async def stopped(worker: Worker, running: asyncio.Task[WorkerStats]) -> None:
    worker.stop()
    async with asyncio.timeout(GUARD):
        await running


def worker_of(server: RedisServer) -> tuple[App, Worker]:
    app = App(f"{server.url}?namespace=beats")

    @app.task(lease=0.6)  # a beat every 0.2 s
    def idle(ctx: Context, element: str) -> None: ...

    return app, Worker(app, concurrency=1)


@pytest.mark.parametrize("outage", ["killed", "stopped"])
async def test_a_redis_outage_is_one_warning_and_one_line_once_calls_succeed_again(
    server: RedisServer, records: Records, monkeypatch: pytest.MonkeyPatch, outage: str
) -> None:
    # Each failing beat fails in about a second (not after 15 s of patience, or 30 of silence);
    # a call to a server back up takes far less, even on a loaded machine.
    monkeypatch.setattr(backend_module, "RECONNECT_PATIENCE", 0.3)
    monkeypatch.setattr(lanes, "CALL_TIMEOUT", 1.0)
    # The idle worker claims every 0.3 s, woken or not (its wake-ups stop with the server).
    monkeypatch.setattr(runner, "MAX_IDLE", 0.3)
    app, worker = worker_of(server)
    running = asyncio.create_task(worker.run())
    try:
        await records.until(
            lambda: any("started on" in r.getMessage() for r in records.records), "the start"
        )
        if outage == "killed":
            server.stop(kill=True)
        else:
            server.pause()
        await records.until(
            lambda: len(records.failed_beats()) >= FAILED_BEATS, f"{FAILED_BEATS} failed beats"
        )
        await records.until(lambda: len(records.failed_claims()) >= 2, "2 failed claims")
        failing = records.failed_beats()
        assert [r for r in failing if r.exc_info] == [], "a traceback for an outage"
        warned = [r for r in failing if r.levelno >= logging.WARNING]
        assert len(warned) == 1, [r.getMessage() for r in warned]
        assert warned[0].levelno == logging.WARNING
        assert "lost Redis at redis://127.0.0.1:" in warned[0].getMessage()  # the reason
        assert all(r.levelno == logging.DEBUG for r in failing[1:])

        if outage == "killed":
            server.start()
        else:
            server.resume()
        for what in ("heartbeats", "claims"):
            await records.until(
                functools.partial(records.logged, f"{what} succeed again, after"),
                f"{what} succeeding again",
            )
        (back,) = [r for r in records.about_beats() if "succeed again, after" in r.getMessage()]
        assert back.levelno == logging.INFO
        counted = re.search(r"after (\d+) failed in ", back.getMessage())
        assert counted is not None and int(counted[1]) >= FAILED_BEATS, back.getMessage()
        assert [r for r in records.records if r.exc_info] == []
        assert len([r for r in records.about_beats() if r.levelno >= logging.WARNING]) == 1
        claims = records.failed_claims()
        assert [r.levelno for r in claims] == [logging.WARNING] + [logging.DEBUG] * (
            len(claims) - 1
        )
        assert "lost Redis at redis://127.0.0.1:" in claims[0].getMessage()
    finally:
        if outage == "stopped":
            server.resume()
        await stopped(worker, running)
        await app.aclose()


async def test_an_error_other_than_an_outage_keeps_its_traceback(
    server: RedisServer, records: Records
) -> None:
    """A heartbeat Redis refuses (a full server here) is no outage: logged with its
    traceback at each beat, as before."""
    app, worker = worker_of(server)
    running = asyncio.create_task(worker.run())
    admin = redis.Redis.from_url(server.url)
    try:
        await records.until(
            lambda: any("started on" in r.getMessage() for r in records.records), "the start"
        )
        admin.config_set("maxmemory", 1)  # every operation refused: -OOM
        await records.until(lambda: len(records.failed_beats()) >= 2, "2 failed beats")
        admin.config_set("maxmemory", 0)
        failing = records.failed_beats()
        assert all(r.exc_info and r.levelno == logging.ERROR for r in failing[:2])
        assert "Redis is full" in str(failing[0].exc_info[1])  # type: ignore[index]
    finally:
        admin.config_set("maxmemory", 0)
        admin.close()
        await stopped(worker, running)
        await app.aclose()


async def test_finished_elements_recorded_through_an_outage_are_one_warning_and_one_line(
    server: RedisServer, records: Records, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An element finishes while Redis is down: its record is retried every second, with
    one WARNING, not a traceback each time, and written once Redis is back."""
    monkeypatch.setattr(backend_module, "RECONNECT_PATIENCE", 0.3)
    monkeypatch.setattr(lanes, "CALL_TIMEOUT", 1.0)
    app = App(f"{server.url}?namespace=records")
    started, release = asyncio.Event(), asyncio.Event()

    @app.task(lease=60)
    async def held(ctx: Context, element: str) -> None:
        started.set()
        await release.wait()

    await app.aschedule(held, "http://a.test/1")
    worker = Worker(app, concurrency=1)
    running = asyncio.create_task(worker.run())

    def failed_records() -> list[logging.LogRecord]:
        return [r for r in records.records if "recording finished elements" in r.getMessage()]

    try:
        await asyncio.wait_for(started.wait(), GUARD)
        server.stop(kill=True)
        release.set()
        await records.until(lambda: len(failed_records()) >= 2, "2 failed records")
        server.start()
        await records.until(
            functools.partial(records.logged, "records of finished elements succeed again, after"),
            "records written again",
        )
        failed = failed_records()
        assert [r.levelno for r in failed] == [logging.WARNING] + [logging.DEBUG] * (
            len(failed) - 1
        )
        assert [r for r in records.records if r.exc_info] == []
    finally:
        release.set()
        await stopped(worker, running)
    try:
        assert worker.stats.done == 1
        (stats,) = await (await app.backend()).queue_stats(["held"])
        assert stats.total == 0
    finally:
        await app.aclose()
