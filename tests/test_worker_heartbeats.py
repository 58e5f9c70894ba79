"""A worker's heartbeats keep it listed whatever its leases: three beats a lease, and at
least three within the silence after which a backend forgets a worker (WORKER_TTL)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from crawlq import App, Context
from crawlq.backends import base
from crawlq.worker import Worker

from .conftest import backend_url
from .helpers import ManualClock

GUARD = 60.0  # seconds: only a failing test waits this long


@pytest.fixture(params=["sqlite", "redis"])
async def url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    return backend_url(request.param, tmp_path, request)


async def test_a_worker_of_hour_long_leases_beats_within_the_worker_ttl(
    url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(base, "WORKER_TTL", 0.6)  # beats 0.2 s apart; an hour's lease: 1,200
    clock = ManualClock(1_800_000_000.0)
    app = App(url, clock=clock)

    @app.task(lease=3600)
    def slow(ctx: Context, element: str) -> None: ...

    worker = Worker(app, concurrency=1)
    running = asyncio.create_task(worker.run())
    backend = await app.backend()
    try:
        async with asyncio.timeout(GUARD):
            while worker.id not in {w.id for w in await backend.workers()}:
                await asyncio.sleep(0.01)
            clock.t += 100  # its last beat is 100 s old: a beat must come, by this clock
            while not any(
                w.id == worker.id and w.heartbeat == clock.t for w in await backend.workers()
            ):
                await asyncio.sleep(0.01)
    finally:
        worker.stop()
        await running
        await app.aclose()
