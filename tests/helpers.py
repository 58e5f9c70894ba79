"""Small tools for tests: a clock to drive by hand and shortcuts to schedule and claim."""

from __future__ import annotations

import fcntl
import os
from collections.abc import Sequence

from crawlq.backends import Backend
from crawlq.tasks import prepare
from crawlq.types import (
    JSON,
    Claimed,
    GroupBy,
    Leases,
    Limit,
    LimitRule,
    Mode,
    QueueConfig,
    ScheduleResult,
)

START = 1_800_000_000.0


class ManualClock:
    """A backend clock that moves only when told."""

    def __init__(self, start: float = START) -> None:
        self.t = start

    def __call__(self) -> float:
        return self.t

    def advance(self, seconds: float) -> None:
        self.t += seconds


def config(queue: str) -> QueueConfig:
    by = {"jobs": GroupBy.NONE, "domains": GroupBy.DOMAIN}.get(queue, GroupBy.HOST)
    return QueueConfig(name=queue, group_by=by, seen=queue == "crawl")


async def schedule(
    backend: Backend,
    queue: str,
    elements: Sequence[JSON],
    *,
    seconds: float = 0,
    priority: int = 0,
    mode: Mode = Mode.OVERWRITE,
    revisit: bool = False,
) -> ScheduleResult:
    due = backend.now() + seconds
    items = [
        prepare(config(queue), e, due=due, priority=priority, mode=mode, revisit=revisit)
        for e in elements
    ]
    return await backend.schedule(items)


async def claim(
    backend: Backend,
    queues: str | Sequence[str] = "pages",
    limit: int = 100,
    lease: Leases = 3600,
) -> list[Claimed]:
    names = [queues] if isinstance(queues, str) else list(queues)
    result = await backend.claim(names, worker="test-worker", limit=limit, lease=lease)
    return result.elements


def payloads(claimed: Sequence[Claimed]) -> list[str]:
    return [c.payload for c in claimed]


def url(host: str, n: int | str = 0) -> str:
    return f"http://{host}/page/{n}"


async def fill_for_damage(backend: Backend) -> None:
    """A little of every state (ready in two groups, delayed, running) and a clean check:
    what the checker's damage tests then corrupt one way at a time."""
    await backend.ensure_queues([config("pages")])
    await schedule(backend, "pages", [url("a.test", i) for i in range(3)])
    await schedule(backend, "pages", [url("b.test", 1)], seconds=60)
    await claim(backend, limit=1)
    assert await backend.check() == []


async def assert_a_rule_of_old_is_the_apps(backend: Backend, pattern: str) -> None:
    """The rule for `pattern`, stored before rules had an origin, reads as the app's: an
    operator's rule replaces it, and the app's rules then leave the operator's alone."""
    found = {(r.pattern, r.origin) for r in await backend.limits()}
    assert found == {("*", "app"), (pattern, "app")}
    operator = LimitRule(pattern=pattern, limit=Limit(concurrency=3), origin="operator")
    await backend.set_limits([operator])
    await backend.set_limits([LimitRule(pattern=pattern, limit=Limit(concurrency=9))])
    assert [r for r in await backend.limits() if r.pattern == pattern] == [operator]


def can_take(path: str) -> bool:
    """Whether another open file of `path` gets its flock now (never waits): a SQLite write
    turn (`path` ending in writelock.SUFFIX) that no process holds."""
    fd = os.open(path, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    finally:
        os.close(fd)
    return True
