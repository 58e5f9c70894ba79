"""The SQLite consistency checker sees damage: conftest runs `check()` after every conformance
test, so each corruption below must be reported, or that check would prove nothing."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from crawlq.backends import open_backend

from .helpers import ManualClock, config, fill_for_damage, schedule, url


async def test_the_checker_finds_each_kind_of_damage(tmp_path: Path, clock: ManualClock) -> None:
    path = tmp_path / "queue.db"
    backend = open_backend(f"sqlite:///{path}", clock=clock)
    await backend.open()
    try:
        await fill_for_damage(backend)
        damages = [
            ("UPDATE counts SET n = n + 1 WHERE state = 1", "count of state 1"),
            ("UPDATE groups SET running = running + 1 WHERE name = 'a.test'", "group a.test"),
            ("UPDATE elements SET lease_until = 1 WHERE state = 1", "its lease"),
            ("DELETE FROM frontier", "best ready element"),
            ("UPDATE elements SET next_payload = '1' WHERE state = 2", "remembered"),
            ("UPDATE elements SET next_due = 1, next_priority = 0 WHERE state = 1", "remembered"),
        ]
        for statement, expected in damages:
            with sqlite3.connect(path) as db:
                db.execute(statement)
            problems = await backend.check()
            assert any(expected in p for p in problems), (expected, problems)
    finally:
        await backend.close()


async def test_a_waiting_row_with_the_wrong_gate_is_reported(
    tmp_path: Path, clock: ManualClock
) -> None:
    path = tmp_path / "queue.db"
    backend = open_backend(f"sqlite:///{path}", clock=clock)
    await backend.open()
    try:
        await backend.ensure_queues([config("pages")])
        await schedule(backend, "pages", [url("a.test", 1)])
        await backend.block_group("a.test", clock() + 60, "test")
        assert await backend.check() == []
        with sqlite3.connect(path) as db:
            db.execute("UPDATE frontier SET wake_at = wake_at + 1")
        assert any("wake_at" in p for p in await backend.check())
    finally:
        await backend.close()
