"""A database an older crawlq made opens in this one: its migrations run once, in order, and
what it held keeps its meaning."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from crawlq.backends import open_backend
from crawlq.backends.sqlite.store import MIGRATIONS, SCHEMA_VERSION, _statements
from crawlq.tasks import prepare
from crawlq.types import GroupBy, Limit, QueueConfig

from .helpers import assert_a_rule_of_old_is_the_apps, config, schedule, url


def older_database(path: Path, version: int) -> None:
    """A database as crawlq made it at schema `version`."""
    with sqlite3.connect(path) as db:
        for number, script in MIGRATIONS:
            if number <= version:
                for statement in _statements(script):
                    db.execute(statement)
        db.execute(f"PRAGMA user_version = {version}")
    db.close()


async def test_rules_stored_before_they_had_an_origin_are_the_apps(tmp_path: Path) -> None:
    path = tmp_path / "queue.db"
    older_database(path, 7)
    with sqlite3.connect(path) as db:
        db.execute("INSERT INTO limits VALUES ('slow.test', 1, 2.0)")
    db.close()
    backend = open_backend(f"sqlite:///{path}")
    await backend.open()
    try:
        await assert_a_rule_of_old_is_the_apps(backend, "slow.test")
        assert await backend.check() == []
    finally:
        await backend.close()
    with sqlite3.connect(path) as db:
        assert db.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
    db.close()


async def test_crawl_delay_rules_of_schema_8_become_crawl_delays(tmp_path: Path) -> None:
    """Schema 8 kept a Crawl-delay as an exact rule of origin 'crawl', which outranked every
    glob; schema 9 keeps it as a floor under the interval of whatever rule matches."""
    path = tmp_path / "queue.db"
    older_database(path, 8)
    with sqlite3.connect(path) as db:
        db.execute("INSERT INTO limits VALUES ('c.test', 4, 3.0, 'crawl')")
        db.execute("INSERT INTO limits VALUES ('a[*]b.test', 4, 5.0, 'crawl')")  # glob_escape'd
        db.execute("INSERT INTO limits VALUES ('*.test', 2, 0.0, 'operator')")
        db.execute("INSERT INTO groups (name, concurrency, interval) VALUES ('c.test', 4, 3.0)")
    db.close()
    backend = open_backend(f"sqlite:///{path}")
    await backend.open()
    try:
        assert await backend.crawl_delays() == {"a*b.test": 5.0, "c.test": 3.0}
        (stored,) = await backend.group_stats("c.test", include_idle=True)
        assert stored.limit == Limit(concurrency=2, interval=3.0)  # resolved again at once
        assert {r.pattern: r.origin for r in await backend.limits()} == {
            "*": "app",
            "*.test": "operator",
        }
        await backend.ensure_queues([config("pages")])
        await schedule(backend, "pages", [url("a*b.test", 1)])
        (group,) = await backend.group_stats("a[*]b.test")
        assert group.limit == Limit(concurrency=2, interval=5.0)
    finally:
        await backend.close()


async def test_a_schedule_remembered_before_schema_10_keeps_the_running_payload(
    tmp_path: Path,
) -> None:
    """Schema 10 remembers the payload of a schedule that comes while its element runs
    (next_payload); a schedule remembered before it has none and runs with the payload it had,
    as it did then, at its remembered time and priority."""
    path = tmp_path / "queue.db"
    keyed = QueueConfig(name="keyed", group_by=GroupBy.NONE, custom_key=True)
    backend = open_backend(f"sqlite:///{path}")
    await backend.open()
    try:
        await backend.ensure_queues([keyed])
        await backend.schedule([prepare(keyed, {"v": 1}, due=0, key=lambda e: "k")])
        (running,) = (await backend.claim(["keyed"], worker="w", limit=1, lease=60)).elements
        await backend.schedule([prepare(keyed, {"v": 2}, due=0, priority=3, key=lambda e: "k")])
    finally:
        await backend.close()
    with sqlite3.connect(path) as db:  # as schema 9 held it: the new payload was never stored
        db.execute("ALTER TABLE elements DROP COLUMN next_payload")
        db.execute("DROP TABLE robots_answers")  # schema 11's
        db.execute("PRAGMA user_version = 9")
    db.close()
    backend = open_backend(f"sqlite:///{path}")
    await backend.open()
    try:
        await backend.ack([running])
        (again,) = (await backend.claim(["keyed"], worker="w", limit=1, lease=60)).elements
        assert (again.payload, again.priority) == ('{"v":1}', 3)
        assert await backend.check() == []
    finally:
        await backend.close()
    with sqlite3.connect(path) as db:
        assert db.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
        assert db.execute("SELECT next_payload FROM elements").fetchall() == [(None,)]
    db.close()


async def test_a_database_of_schema_10_keeps_robots_txt_answers_once_opened(
    tmp_path: Path,
) -> None:
    path = tmp_path / "queue.db"
    older_database(path, 10)
    backend = open_backend(f"sqlite:///{path}")
    await backend.open()
    try:
        await backend.keep_robots_answer("http://a.test", b"answer", 60.0)
        kept = await backend.robots_answer("http://a.test")
        assert kept is not None and kept[0] == b"answer"
        assert await backend.check() == []
    finally:
        await backend.close()
    with sqlite3.connect(path) as db:
        assert db.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION == 11
    db.close()
