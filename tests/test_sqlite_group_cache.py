"""A SQLite process keeps the ids of at most GROUP_CACHE_SIZE groups in memory: a crawl meets
millions of hosts, most of them once, and each cached name cost ~150 bytes for good."""

from __future__ import annotations

from pathlib import Path

import pytest

from crawlq.backends import open_backend
from crawlq.backends.sqlite import engine
from crawlq.backends.sqlite.backend import SQLiteBackend

from .helpers import claim, config, schedule, url


async def test_a_process_forgets_group_ids_beyond_its_cache_and_finds_them_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(engine, "GROUP_CACHE_SIZE", 10)
    backend = open_backend(f"sqlite:///{tmp_path / 'queue.db'}")
    assert isinstance(backend, SQLiteBackend)
    await backend.open()
    try:
        await backend.ensure_queues([config("pages")])
        hosts = [f"h{n}.test" for n in range(35)]
        for host in hosts:
            await schedule(backend, "pages", [url(host, 1)])
        await schedule(backend, "pages", [url(host, 2) for host in hosts])  # ids read again
        cached = len(backend.engine._groups)
        running = await claim(backend, limit=100)
        stats = {g.name: (g.queued, g.running) for g in await backend.group_stats(limit=100)}
        await backend.ack(running)
        assert await backend.check() == []
    finally:
        await backend.close()
    assert cached <= 10
    assert len(running) == 70
    assert stats == {host: (0, 2) for host in hosts}
