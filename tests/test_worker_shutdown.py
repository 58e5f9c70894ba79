"""A worker stopping while its backend cannot be written: the final writes of finished elements
are given up in bounded time (the grace period, or at once on a second stop), and the worker
returns. Nothing is lost: the elements are still leased in the queue and run again."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator
from typing import Any

import pytest
import redis

import crawlq
from crawlq.testing.redis_server import RedisServer
from crawlq.worker import Worker

GUARD = 90.0  # seconds: only a failing test waits this long


@pytest.fixture
def server() -> Iterator[RedisServer]:
    own = RedisServer()
    own.start()
    try:
        yield own
    finally:
        own.remove()


class Held:
    """An app whose one task waits for `release`, then finishes."""

    def __init__(self, url: str) -> None:
        self.app = crawlq.App(url)
        self.started = asyncio.Event()
        self.release = asyncio.Event()

        @self.app.task(group=None, lease=60)
        async def hold(ctx: crawlq.Context, element: Any) -> None:
            self.started.set()
            await self.release.wait()

    async def start(self, grace: float) -> tuple[Worker, asyncio.Task[Any]]:
        """A worker of one slot, once its task runs."""
        worker = Worker(self.app, concurrency=1, grace=grace)
        await self.app.aschedule("hold", {"n": 1})
        running = asyncio.create_task(worker.run())
        await asyncio.wait_for(self.started.wait(), GUARD)
        return worker, running


async def wait_until(condition: Any, what: str) -> None:
    async with asyncio.timeout(GUARD):
        while not condition():
            await asyncio.sleep(0.02)
    assert condition(), what


async def test_a_stop_gives_up_writing_to_a_backend_gone_for_good_after_the_grace(
    server: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    held = Held(f"{server.url}?namespace=gone")
    worker, running = await held.start(grace=1.0)
    server.stop()
    worker.stop()  # the claim loop ends: it tries nothing more on the dead server
    held.release.set()
    with caplog.at_level(logging.ERROR, logger="crawlq.worker"):
        stats = await asyncio.wait_for(running, GUARD)
    await held.app.aclose()
    assert (stats.done, stats.unrecorded) == (1, 1)
    assert "gave up recording 1 finished and 0 failed elements" in caplog.text
    assert "run again once their leases expire" in caplog.text


async def test_a_second_stop_gives_up_writing_to_a_backend_refusing_writes_at_once(
    server: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    held = Held(f"{server.url}?namespace=refusing")
    worker, running = await held.start(grace=600.0)
    with redis.Redis(port=server.port) as admin:
        admin.config_set("min-replicas-to-write", 1)  # every write refused, as on a full disk
    worker.stop()
    held.release.set()
    await wait_until(lambda: "retrying" in caplog.text, "a failed final write")
    assert not running.done()  # within the grace period it keeps trying
    worker.stop()
    stats = await asyncio.wait_for(running, GUARD)
    await held.app.aclose()
    assert (stats.done, stats.unrecorded) == (1, 1)
    assert "gave up recording 1 finished and 0 failed elements" in caplog.text
