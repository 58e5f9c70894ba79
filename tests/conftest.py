"""Fixtures shared by every test: a manual clock and one open backend per backend kind.

`backend` is parametrized over every backend crawlq has; the Redis backend joins the list
with its own server fixture. A backend whose server is missing fails in CI (CI=true).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from crawlq.backends import Backend, open_backend
from crawlq.types import GroupBy, QueueConfig

from .helpers import ManualClock

BACKENDS = ["sqlite"]

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


def backend_url(kind: str, tmp_path: Path) -> str:
    if kind == "sqlite":
        return f"sqlite:///{tmp_path / 'queue.db'}"
    raise AssertionError(f"no fixture for backend {kind}")


@pytest.fixture(params=BACKENDS)
def url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    return backend_url(request.param, tmp_path)


@pytest.fixture
async def backend(url: str, clock: ManualClock) -> AsyncIterator[Backend]:
    opened = open_backend(url, clock=clock)
    await opened.open()
    await opened.ensure_queues(QUEUES)
    try:
        yield opened
    finally:
        await opened.close()
