"""Fixtures shared by every test: a manual clock and one open backend per backend kind.

`backend` is parametrized over every backend crawlq has. Redis tests share one real
redis-server on a free loopback port (started here, never skipped: a missing redis-server is
an error), each test in a namespace of its own.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from crawlq.backends import Backend, open_backend
from crawlq.testing.redis_server import RedisServer
from crawlq.types import GroupBy, QueueConfig

from .helpers import ManualClock

BACKENDS = ["sqlite", "redis"]

QUEUES = [
    QueueConfig(name="pages"),
    QueueConfig(name="logins"),
    QueueConfig(name="jobs", group_by=GroupBy.NONE),
    QueueConfig(name="crawl", seen=True),
    QueueConfig(name="domains", group_by=GroupBy.DOMAIN),
]


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture(scope="session")
def redis_server() -> Iterator[RedisServer]:
    server = RedisServer()
    server.start()
    try:
        yield server
    finally:
        server.remove()


def backend_url(kind: str, tmp_path: Path, request: pytest.FixtureRequest) -> str:
    if kind == "sqlite":
        return f"sqlite:///{tmp_path / 'queue.db'}"
    if kind == "redis":
        server: RedisServer = request.getfixturevalue("redis_server")
        return f"{server.url}?namespace=test-{uuid.uuid4().hex[:12]}"
    raise AssertionError(f"no fixture for backend {kind}")


@pytest.fixture(params=BACKENDS)
def url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    return backend_url(request.param, tmp_path, request)


@pytest.fixture
async def backend(url: str, clock: ManualClock) -> AsyncIterator[Backend]:
    opened = open_backend(url, clock=clock)
    await opened.open()
    await opened.ensure_queues(QUEUES)
    try:
        yield opened
        assert await opened.check() == []
    finally:
        await opened.close()
