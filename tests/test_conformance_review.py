"""SPEC section 3 at its edges, against every backend (conftest.BACKENDS): what a review found
the conformance suite left out. Time is a manual clock, as in test_conformance.py."""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

import pytest

from crawlq.backends import Backend
from crawlq.errors import ConfigError
from crawlq.tasks import prepare
from crawlq.types import Limit, LimitRule

from .helpers import ManualClock, claim, config, schedule, url


async def test_a_lease_is_claimable_again_at_the_time_the_claim_said(
    backend: Backend, clock: ManualClock
) -> None:
    """SPEC 3.4: the next claimable time was the lease's end, but a lease only expired after
    it, so a worker that woke then found nothing and was told "now" again: it spun."""
    await backend.set_limits([LimitRule(pattern="*", limit=Limit(concurrency=1))])
    await schedule(backend, "pages", [url("a.test", 1), url("a.test", 2)])
    (lost,) = await claim(backend, lease=50)
    result = await backend.claim(["pages"], worker="w", limit=10, lease=50)
    assert (result.elements, result.next_at) == ([], clock() + 50)
    clock.advance(50)
    (again,) = await claim(backend, lease=50)
    assert (again.key, again.attempt) == (lost.key, 2)


async def test_a_claim_that_takes_fewer_than_asked_says_when_the_rest_is_claimable(
    backend: Backend, clock: ManualClock
) -> None:
    """SPEC 3.4: on Redis a claim takes at most 5,000 (one Lua call holds the server); it
    answered a bigger one with those and no next claimable time, as if nothing was left."""
    await schedule(backend, "jobs", list(range(5_003)))
    result = await backend.claim(["jobs"], worker="w", limit=6_000, lease=60)
    (stats,) = await backend.queue_stats(["jobs"])
    assert len(result.elements) + stats.due == 5_003
    assert stats.due == 0 or result.next_at == clock()


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("due", float("nan")),
        ("due", float("inf")),
        ("priority", 2**63),
        ("priority", 2**53),
        ("priority", 1.5),
        ("priority", True),
    ],
)
async def test_a_schedule_of_no_time_or_no_whole_priority_is_refused_and_changes_nothing(
    backend: Backend, clock: ManualClock, field: str, value: object
) -> None:
    """SPEC 9, for callers of a backend itself (App checks its own): Redis refused these with a
    ConfigError naming the field; SQLite stored an infinite due time or a priority of 1.5 or
    2**60 (which Redis cannot order exactly), and failed on NaN with a NOT NULL constraint and
    on 2**63 with an OverflowError, no crawlq error at all."""
    good = prepare(config("jobs"), "good", due=clock())
    changes: dict[str, Any] = {field: value}
    bad = replace(good, key='"bad"', **changes)
    with pytest.raises(ConfigError, match=field):
        await backend.schedule([good, bad])
    with pytest.raises(ConfigError, match=field):
        await backend.finish([bad], [], [])
    (stats,) = await backend.queue_stats(["jobs"])
    assert stats.total == 0


@pytest.mark.parametrize("lease", [float("nan"), float("inf"), -1.0])
async def test_a_lease_of_no_time_is_refused_and_loses_no_element(
    backend: Backend, clock: ManualClock, lease: float
) -> None:
    """SPEC 6 and 9, for callers of a backend itself (App checks a task's lease): a NaN lease
    left the element running with no lease at all on SQLite (NULL: it never expired), and on
    Redis failed after the claim had written it running, outside the lease set: lost for good
    either way."""
    from crawlq.types import WorkerInfo

    worker = WorkerInfo(id="w", host="h", pid=1, queues=("jobs",), started=clock(), heartbeat=0)
    await schedule(backend, "jobs", ["x"])
    with pytest.raises(ConfigError, match="lease"):
        await backend.claim(["jobs"], worker="w", limit=1, lease=lease)
    with pytest.raises(ConfigError, match="lease"):
        await backend.claim(["jobs"], worker="w", limit=1, lease={"jobs": lease})
    (taken,) = await claim(backend, "jobs", lease=5)
    with pytest.raises(ConfigError, match="lease"):
        await backend.heartbeat(worker, [taken], lease)
    clock.advance(5)
    (again,) = await claim(backend, "jobs", lease=5)
    assert (again.key, again.attempt) == ('"x"', 2)


async def test_a_retry_at_no_time_is_refused_and_changes_nothing(
    backend: Backend, clock: ManualClock
) -> None:
    """SPEC 9, for callers of a backend itself (the worker computes retry times): on Redis a
    NaN retry time was stored as the element's due time, and `check` itself then failed on the
    store; SQLite read it as no time and retried at once."""
    from crawlq.types import Failure

    await schedule(backend, "jobs", ["x"])
    (taken,) = await claim(backend, "jobs", lease=5)
    failure = Failure(element=taken, error="boom", retry_at=float("nan"))
    with pytest.raises(ConfigError, match="retry"):
        await backend.fail([failure])
    with pytest.raises(ConfigError, match="retry"):
        await backend.finish([], [], [failure])
    info = await backend.element("jobs", '"x"')
    assert info is not None and (info.state, info.attempts) == ("running", 1)


async def test_a_workers_elements_are_listed_by_queue_and_key(backend: Backend) -> None:
    """SPEC 7: SQLite lists them by queue and key; Redis listed them in the order of its lease
    members (the key's digest), so the dashboard's list changed with the backend."""
    await schedule(backend, "jobs", [f"e{n}" for n in range(12)])
    await schedule(backend, "pages", [url(f"h{n}.test") for n in range(4)])
    await claim(backend, ["jobs", "pages"])
    held = [(e.queue, e.key) for e in await backend.worker_elements("test-worker")]
    assert len(held) == 16 and held == sorted(held)


async def test_a_block_until_no_time_is_refused(backend: Backend, clock: ManualClock) -> None:
    """SPEC 9: SQLite stored a NaN block end as none (the group open, its reason still shown),
    Redis as "nan"; the two then reported the group differently."""
    await schedule(backend, "pages", [url("a.test")])
    with pytest.raises(ConfigError, match="until"):
        await backend.block_group("a.test", float("nan"), "429")
    (group,) = await backend.group_stats("a.test")
    assert (group.blocked_until, group.block_reason) == (None, None)


async def test_a_group_open_again_after_its_block_serves_each_of_its_queues(
    backend: Backend, clock: ManualClock
) -> None:
    """A claim that leaves its group open (no interval, under its concurrency) moves the
    group's gate without touching the group's sub-queue in another queue, which waited for
    the block's end: that queue's next claim finds it due, and the queue is consistent."""
    await backend.set_limits([LimitRule(pattern="*", limit=Limit(concurrency=4))])
    await schedule(backend, "pages", [url("a.test", 1), url("a.test", 2)])
    await schedule(backend, "crawl", [url("a.test", 3)])
    await backend.block_group("a.test", clock() + 10, "503")
    assert await claim(backend, ["pages", "crawl"]) == []
    clock.advance(11)
    first = await claim(backend, "pages", limit=1)
    assert await backend.check() == []
    clock.advance(1)
    other = await claim(backend, "crawl")
    assert [json.loads(c.key) for c in first + other] == [url("a.test", 1), url("a.test", 3)]
