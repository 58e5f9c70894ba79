"""SPEC section 3, semantic by semantic, against every backend (see conftest.BACKENDS).

Time is a manual clock, so due times, intervals, blocks and leases are exact and nothing
here sleeps. Processes, signals and real time are in test_worker_processes.py.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence
from dataclasses import replace

import pytest

from crawlq.backends import Backend, open_backend
from crawlq.backends.base import MAX_ROBOTS_ANSWER
from crawlq.errors import ConfigError, InvalidElement, UnknownQueue
from crawlq.limits import DEFAULT_LIMIT
from crawlq.tasks import prepare
from crawlq.types import (
    JSON,
    NEVER,
    Claimed,
    Failure,
    Limit,
    LimitRule,
    Mode,
    Origin,
    QueueConfig,
)

from .helpers import ManualClock, claim, config, schedule, url

#: `counts` of a queue with nothing in it, not even dead letters.
NOTHING = {"total": 0, "due": 0, "delayed": 0, "running": 0, "dead": 0}


def elements(claimed: Sequence[Claimed]) -> list[JSON]:
    return [json.loads(c.payload) for c in claimed]


async def counts(backend: Backend, queue: str = "pages") -> dict[str, int]:
    (stats,) = await backend.queue_stats([queue])
    return {
        "total": stats.total,
        "due": stats.due,
        "delayed": stats.delayed,
        "running": stats.running,
        "dead": stats.dead,
    }


async def unlimited(backend: Backend) -> None:
    await backend.set_limits([LimitRule(pattern="*", limit=Limit())])


# -- 1. uniqueness, overwrite, only_if_earlier, only_if_new, bulk ------------------------------


async def test_scheduling_an_element_twice_keeps_one(backend: Backend) -> None:
    first = await schedule(backend, "pages", [url("a.test")])
    second = await schedule(backend, "pages", [url("a.test")])
    assert (first.added, second.added, second.moved) == (1, 0, 1)
    assert (await counts(backend))["total"] == 1


async def test_identity_is_canonical_json(backend: Backend) -> None:
    await schedule(backend, "jobs", [{"a": 1, "b": [1, 2]}, {"b": [1, 2], "a": 1}])
    await schedule(backend, "jobs", [{"b": [1, 2], "a": 1}])
    assert (await counts(backend, "jobs"))["total"] == 1


async def test_ten_thousand_schedules_of_a_thousand_elements_leave_a_thousand(
    backend: Backend,
) -> None:
    batch = [url(f"h{i % 1000 % 7}.test", i % 1000) for i in range(10_000)]
    result = await schedule(backend, "pages", batch)
    assert result.added == 1000
    for start in range(0, 10_000, 2_500):
        await schedule(backend, "pages", batch[start : start + 2_500], seconds=5)
    for i in range(0, 10_000, 97):
        await schedule(backend, "pages", [batch[i]], seconds=i)
    assert (await counts(backend))["total"] == 1000


async def test_rescheduling_moves_due_time_and_priority(
    backend: Backend, clock: ManualClock
) -> None:
    await schedule(backend, "jobs", ["a", "b"])
    await schedule(backend, "jobs", ["a"], seconds=60)
    assert elements(await claim(backend, "jobs")) == ["b"]
    clock.advance(60)
    await schedule(backend, "jobs", ["c"])
    await schedule(backend, "jobs", ["c"], priority=5)
    assert elements(await claim(backend, "jobs")) == ["c", "a"]


async def test_only_if_earlier_moves_forward_only(backend: Backend, clock: ManualClock) -> None:
    await schedule(backend, "jobs", ["x"], seconds=100)
    kept = await schedule(backend, "jobs", ["x"], seconds=200, mode=Mode.ONLY_IF_EARLIER)
    assert (kept.moved, kept.kept) == (0, 1)
    moved = await schedule(backend, "jobs", ["x"], seconds=10, mode=Mode.ONLY_IF_EARLIER)
    assert moved.moved == 1
    clock.advance(10)
    assert elements(await claim(backend, "jobs")) == ["x"]


async def test_only_if_new_keeps_the_existing_schedule(
    backend: Backend, clock: ManualClock
) -> None:
    await schedule(backend, "jobs", ["x"], seconds=100)
    result = await schedule(backend, "jobs", ["x"], mode=Mode.ONLY_IF_NEW)
    assert (result.added, result.moved, result.kept) == (0, 0, 1)
    assert await claim(backend, "jobs") == []
    clock.advance(100)
    assert elements(await claim(backend, "jobs")) == ["x"]


async def test_repeats_inside_one_batch_apply_in_order(
    backend: Backend, clock: ManualClock
) -> None:
    items = [
        prepare(config("jobs"), "x", due=clock() + 50),
        prepare(config("jobs"), "x", due=clock() + 20, mode=Mode.ONLY_IF_EARLIER),
        prepare(config("jobs"), "x", due=clock() + 90, mode=Mode.ONLY_IF_EARLIER),
        prepare(config("jobs"), "x", due=clock() + 0, mode=Mode.ONLY_IF_NEW),
    ]
    await backend.schedule(items)
    clock.advance(19)
    assert await claim(backend, "jobs") == []
    clock.advance(1)
    assert elements(await claim(backend, "jobs")) == ["x"]


async def test_a_batch_adding_only_if_new_then_moving_only_if_earlier_does_both_in_order(
    backend: Backend, clock: ManualClock
) -> None:
    """The move applies to an element that was there already, not to one the add made: as
    two calls, so as one batch (a worker sends its tasks' follow-ups together)."""
    await schedule(backend, "jobs", ["there"], seconds=100)
    await backend.schedule(
        [
            prepare(config("jobs"), name, due=clock() + 50, mode=Mode.ONLY_IF_NEW)
            for name in ("there", "new")
        ]
        + [
            prepare(config("jobs"), name, due=clock() + 90, mode=Mode.ONLY_IF_EARLIER)
            for name in ("there", "new")
        ]
    )
    there, new = await backend.element("jobs", '"there"'), await backend.element("jobs", '"new"')
    assert there is not None and new is not None
    assert (there.due, new.due) == (clock() + 90, clock() + 50)


# -- 2. an element that is running is never started twice -------------------------------------


async def test_rescheduling_a_running_element_waits_for_it_to_finish(
    backend: Backend, clock: ManualClock
) -> None:
    await schedule(backend, "jobs", ["x"])
    (running,) = await claim(backend, "jobs")
    result = await schedule(backend, "jobs", ["x"], seconds=5)
    assert result.deferred == 1
    clock.advance(10)
    assert await claim(backend, "jobs") == []
    await backend.ack([running])
    (again,) = await claim(backend, "jobs")
    assert (json.loads(again.payload), again.attempt) == ("x", 1)


async def test_a_schedule_remembered_while_running_keeps_its_future_time(
    backend: Backend, clock: ManualClock
) -> None:
    await schedule(backend, "jobs", ["x"])
    (running,) = await claim(backend, "jobs")
    await schedule(backend, "jobs", ["x"], seconds=30)
    await backend.ack([running])
    assert await claim(backend, "jobs") == []
    assert (await counts(backend, "jobs"))["delayed"] == 1
    clock.advance(30)
    assert len(await claim(backend, "jobs")) == 1


# -- 3. claim: due, priority, group slots, interval, blocks, atomic ----------------------------


async def test_claim_takes_only_due_elements(backend: Backend, clock: ManualClock) -> None:
    await schedule(backend, "jobs", ["later"], seconds=10)
    await schedule(backend, "jobs", ["now"])
    assert elements(await claim(backend, "jobs")) == ["now"]
    clock.advance(9.999)
    assert await claim(backend, "jobs") == []
    clock.advance(0.001)
    assert elements(await claim(backend, "jobs")) == ["later"]


async def test_priority_then_due_time_then_insertion(backend: Backend, clock: ManualClock) -> None:
    await schedule(backend, "jobs", ["late-low"], seconds=1)
    await schedule(backend, "jobs", ["first-low", "second-low"])
    await schedule(backend, "jobs", ["high"], priority=10, seconds=2)
    await schedule(backend, "jobs", ["mid"], priority=5)
    await schedule(backend, "jobs", ["future-top"], priority=99, seconds=100)
    clock.advance(2)
    assert elements(await claim(backend, "jobs")) == [
        "high",
        "mid",
        "first-low",
        "second-low",
        "late-low",
    ]


async def test_priority_holds_across_groups(backend: Backend) -> None:
    await unlimited(backend)
    await schedule(backend, "pages", [url("a.test", 1), url("a.test", 2)])
    await schedule(backend, "pages", [url("b.test", 1)], priority=3)
    await schedule(backend, "pages", [url("c.test", 1)], priority=1)
    assert elements(await claim(backend)) == [
        url("b.test", 1),
        url("c.test", 1),
        url("a.test", 1),
        url("a.test", 2),
    ]


async def test_group_concurrency_limits_elements_in_flight(backend: Backend) -> None:
    await backend.set_limits([LimitRule(pattern="a.test", limit=Limit(concurrency=2))])
    await schedule(backend, "pages", [url("a.test", i) for i in range(5)])
    await schedule(backend, "pages", [url("b.test", i) for i in range(3)])
    first = await claim(backend)
    by_group = sorted(c.group for c in first)
    assert by_group == ["a.test", "a.test", "b.test", "b.test", "b.test"]
    assert await claim(backend) == []
    done = next(c for c in first if c.group == "a.test")
    await backend.ack([done])
    assert [c.group for c in await claim(backend)] == ["a.test"]


async def test_group_interval_spaces_starts(backend: Backend, clock: ManualClock) -> None:
    await backend.set_limits([LimitRule(pattern="slow.test", limit=Limit(interval=2.0))])
    await schedule(backend, "pages", [url("slow.test", i) for i in range(3)])
    starts = []
    for _ in range(6):
        for claimed in await claim(backend):
            starts.append(claimed.claimed_at)
            await backend.ack([claimed])
        clock.advance(1.0)
    assert [s - starts[0] for s in starts] == [0.0, 2.0, 4.0]


async def test_groups_are_shared_across_queues(backend: Backend) -> None:
    await backend.set_limits([LimitRule(pattern="shared.test", limit=Limit(concurrency=1))])
    await schedule(backend, "pages", [url("shared.test", 1)])
    await schedule(backend, "logins", [url("shared.test", "login")])
    taken = await claim(backend, ["pages", "logins"])
    assert len(taken) == 1
    assert await claim(backend, ["pages", "logins"]) == []
    await backend.ack(taken)
    assert len(await claim(backend, ["pages", "logins"])) == 1


async def test_domain_groups_join_subdomains(backend: Backend) -> None:
    await backend.set_limits([LimitRule(pattern="example.co.uk", limit=Limit(concurrency=1))])
    await schedule(backend, "domains", [url("a.example.co.uk"), url("b.example.co.uk")])
    taken = await claim(backend, "domains")
    assert [c.group for c in taken] == ["example.co.uk"]


async def test_blocked_group_waits_until_the_block_ends(
    backend: Backend, clock: ManualClock
) -> None:
    await schedule(backend, "pages", [url("busy.test"), url("fine.test")])
    await backend.block_group("busy.test", clock() + 30, "429 Retry-After")
    assert [c.group for c in await claim(backend)] == ["fine.test"]
    (group,) = await backend.group_stats("busy.test")
    assert (group.blocked_until, group.block_reason) == (clock() + 30, "429 Retry-After")
    clock.advance(29)
    assert await claim(backend) == []
    clock.advance(1)
    assert [c.group for c in await claim(backend)] == ["busy.test"]


async def test_requests_of_a_group_are_reserved_a_gap_apart_for_every_worker(
    backend: Backend, clock: ManualClock
) -> None:
    assert await backend.reserve_send("slow.test", 0.5) == 0  # the first: at once
    assert await backend.reserve_send("slow.test", 0.5) == pytest.approx(0.5)
    assert await backend.reserve_send("slow.test", 0.5) == pytest.approx(1.0)
    assert await backend.reserve_send("other.test", 0.5) == 0  # groups are independent
    clock.advance(1.2)
    assert await backend.reserve_send("slow.test", 0.5) == pytest.approx(0.3)
    clock.advance(10)
    assert await backend.reserve_send("slow.test", 0.5) == 0
    assert await backend.reserve_send("slow.test", 0.5, 2.0) == pytest.approx(2.0)  # earliest
    assert await backend.reserve_send("slow.test", 0.5) == pytest.approx(2.5)


async def test_a_send_time_further_than_the_caller_waits_is_not_reserved(
    backend: Backend, clock: ManualClock
) -> None:
    """A request that would wait more than it may is put back until its time. Had it kept its
    reservation, its next try, at that time, would find it and wait a gap more, and so on:
    a host with a Crawl-delay over the wait allowed was never fetched past robots.txt."""
    assert await backend.reserve_send("slow.test", 3.0) == 0  # robots.txt
    at, wait, kept = await backend.reserve_send_slot("slow.test", 3.0, max_wait=2.0)
    assert [at, wait, kept] == [pytest.approx(clock() + 3.0), pytest.approx(3.0), False]
    clock.advance(3.0)  # the page, put back until then, is claimed again
    at, wait, kept = await backend.reserve_send_slot("slow.test", 3.0, max_wait=2.0)
    assert [at, wait, kept] == [pytest.approx(clock()), 0, False]
    assert await backend.reserve_send("slow.test", 3.0) == pytest.approx(3.0)  # kept that one


async def test_unblocking_makes_a_group_claimable_at_once(
    backend: Backend, clock: ManualClock
) -> None:
    await schedule(backend, "pages", [url("busy.test")])
    await backend.block_group("busy.test", clock() + 3600, "maintenance")
    assert await claim(backend) == []
    await backend.block_group("busy.test", None, None)
    assert len(await claim(backend)) == 1


async def test_limits_change_at_run_time(backend: Backend) -> None:
    await schedule(backend, "pages", [url("a.test", i) for i in range(10)])
    assert len(await claim(backend)) == 4  # the default rule: 4 at once
    await backend.set_limits([LimitRule(pattern="*.test", limit=Limit(concurrency=6))])
    assert len(await claim(backend)) == 2
    assert await backend.delete_limit("*.test")
    assert await claim(backend) == []


async def test_most_specific_limit_pattern_wins(backend: Backend) -> None:
    await backend.set_limits(
        [
            LimitRule(pattern="*.test", limit=Limit(concurrency=1)),
            LimitRule(pattern="big.test", limit=Limit(concurrency=3)),
        ]
    )
    await schedule(backend, "pages", [url("big.test", i) for i in range(5)])
    await schedule(backend, "pages", [url("small.test", i) for i in range(5)])
    groups = sorted(c.group for c in await claim(backend))
    assert groups == ["big.test"] * 3 + ["small.test"]


async def test_a_rule_for_one_host_changes_that_group_only_and_globs_still_reach_it(
    backend: Backend,
) -> None:
    """Exact rules (a crawl sets one for each Crawl-delay) are kept apart from the globs: each
    change still gives every group the limit the most specific matching rule says."""

    async def limits() -> dict[str, Limit]:
        return {g.name: g.limit for g in await backend.group_stats(include_idle=True)}

    hosts = [f"h{n}.test" for n in range(5)]
    for host in hosts:
        await schedule(backend, "pages", [url(host)])
    await backend.set_limits([LimitRule(pattern="h2.test", limit=Limit(concurrency=1, interval=3))])
    assert await limits() == {h: DEFAULT_LIMIT for h in hosts} | {
        "h2.test": Limit(concurrency=1, interval=3)
    }
    await backend.set_limits([LimitRule(pattern="h*.test", limit=Limit(concurrency=2))])
    assert await limits() == {h: Limit(concurrency=2) for h in hosts} | {
        "h2.test": Limit(concurrency=1, interval=3)
    }
    await schedule(backend, "pages", [url("h9.test")])  # a new group: resolved the same way
    await backend.set_limits([LimitRule(pattern="h9.test", limit=Limit(concurrency=5))])
    assert (await limits())["h9.test"] == Limit(concurrency=5)
    assert await backend.delete_limit("h2.test")
    assert not await backend.delete_limit("h2.test")
    assert await limits() == {h: Limit(concurrency=2) for h in hosts} | {
        "h9.test": Limit(concurrency=5)
    }
    assert {r.pattern for r in await backend.limits()} == {"*", "h*.test", "h9.test"}
    assert await backend.delete_limit("h*.test")
    assert await limits() == {h: DEFAULT_LIMIT for h in hosts} | {"h9.test": Limit(concurrency=5)}


async def test_an_operators_rule_outlasts_the_apps(backend: Backend) -> None:
    """Workers store their app's rules each time they start: an operator's rule for the same
    pattern must survive that (a host slowed down by hand in an incident)."""

    def rule(pattern: str, origin: Origin, concurrency: int, interval: float) -> LimitRule:
        return LimitRule(pattern=pattern, limit=limit(concurrency, interval), origin=origin)

    async def stored() -> dict[str, tuple[Limit, Origin]]:
        return {r.pattern: (r.limit, r.origin) for r in await backend.limits()}

    for host in ("slow.test", "calm.test"):
        await schedule(backend, "pages", [url(host)])
    await backend.set_limits([rule("slow.test", "app", 8, 0), rule("*.test", "app", 6, 0)])
    await backend.set_limits([rule("slow.test", "operator", 1, 2)])
    await backend.set_limits([rule("slow.test", "app", 8, 0), rule("*.test", "app", 5, 0)])
    assert (await stored())["slow.test"] == (limit(1, 2), "operator")
    assert await group_limit(backend, "slow.test") == limit(1, 2)
    assert await group_limit(backend, "calm.test") == limit(5)  # the app's other rules change

    # Deleted, the operator's rule gives the pattern back to the app.
    assert await backend.delete_limit("slow.test")
    assert await group_limit(backend, "slow.test") == limit(5)
    await backend.set_limits([rule("slow.test", "app", 8, 0)])
    assert (await stored())["slow.test"] == (limit(8), "app")
    assert await group_limit(backend, "slow.test") == limit(8)
    # And an operator's rule replaces anyone's at once.
    await backend.set_limits([rule("*.test", "operator", 1, 0)])
    assert (await stored())["*.test"] == (limit(1), "operator")
    assert await group_limit(backend, "calm.test") == limit(1)


async def test_a_crawl_delay_is_a_floor_under_whatever_rule_gives_the_group_its_limit(
    backend: Backend,
) -> None:
    """A host's robots.txt Crawl-delay raises its group's interval, and rules set later, for
    the host or a pattern matching it, still give the group its concurrency and any longer
    interval. (Kept as an exact rule, it outranked every glob: an operator's '*.example.test'
    or the app's new '*' concurrency never reached the host.)"""

    def rule(pattern: str, concurrency: int, interval: float = 0.0) -> LimitRule:
        return LimitRule(pattern=pattern, limit=limit(concurrency, interval))

    for host in ("www.example.test", "other.example.test"):
        await schedule(backend, "pages", [url(host)])
    await backend.set_limits([rule("*", 2)])
    await backend.raise_crawl_delays({"www.example.test": 3.0})
    assert await group_limit(backend, "www.example.test") == limit(2, 3)
    assert await group_limit(backend, "other.example.test") == limit(2)

    await backend.set_limits([replace(rule("*.example.test", 1, 10), origin="operator")])
    assert await group_limit(backend, "www.example.test") == limit(1, 10)
    assert await backend.delete_limit("*.example.test")
    await backend.set_limits([rule("*", 8)])  # the app, deployed again with more concurrency
    assert await group_limit(backend, "www.example.test") == limit(8, 3)
    assert await group_limit(backend, "other.example.test") == limit(8)

    # An exact rule for the host, stored again and again as workers start, keeps the floor.
    for _ in range(2):
        await backend.set_limits([rule("www.example.test", 5, 0.5)])
        assert await group_limit(backend, "www.example.test") == limit(5, 3)
    await backend.raise_crawl_delays({"www.example.test": 1.0})  # never lowered
    await backend.raise_crawl_delays({"new.example.test": 2.0})  # a group not seen yet
    await schedule(backend, "pages", [url("new.example.test")])
    assert await group_limit(backend, "new.example.test") == limit(8, 2)
    assert await backend.crawl_delays() == {"new.example.test": 2.0, "www.example.test": 3.0}
    assert await backend.crawl_delays(["www.example.test", "other.example.test"]) == {
        "www.example.test": 3.0
    }
    assert await backend.crawl_delays([]) == {}
    assert {r.pattern for r in await backend.limits()} == {"*", "www.example.test"}

    # A host whose name holds a wildcard character is a group like any other.
    await schedule(backend, "pages", [url("a*b.example.test")])
    await backend.raise_crawl_delays({"a*b.example.test": 5.0})
    assert await group_limit(backend, "a[*]b.example.test") == limit(8, 5)
    assert await backend.delete_limit("a*b.example.test")
    assert await group_limit(backend, "a[*]b.example.test") == limit(8)
    # Elements without a group are never limited, and a delay is a number of seconds.
    for bad in ({"": 5.0}, {"x.test": -1.0}, {"x.test": float("nan")}):
        with pytest.raises(ValueError):
            await backend.raise_crawl_delays(bad)

    # Deleting by the host's name takes its rule and its Crawl-delay away.
    assert await backend.delete_limit("www.example.test")
    assert await group_limit(backend, "www.example.test") == limit(8)
    assert await backend.crawl_delays() == {"new.example.test": 2.0}
    assert await backend.delete_limit("new.example.test")
    assert await group_limit(backend, "new.example.test") == limit(8)
    assert not await backend.delete_limit("new.example.test")


async def test_a_robots_answer_is_kept_for_every_worker_until_its_time(
    url: str, clock: ManualClock
) -> None:
    # Times of seconds: Redis also drops each by its own clock, a second after its time.
    first, second = open_backend(url, clock=clock), open_backend(url, clock=clock)
    await first.open()
    await second.open()
    try:
        assert await second.robots_answer("http://a.test") is None
        await first.keep_robots_answer("http://a.test", b"\x00rules\xff", 600.0)
        await first.keep_robots_answer("https://b.test:8443", b"", 50.0)
        assert await second.robots_answer("http://a.test") == (b"\x00rules\xff", 600.0)
        assert await second.robots_answer("https://b.test:8443") == (b"", 50.0)
        assert await second.robots_answer("http://A.test") is None  # origins come lower-cased

        clock.advance(100)
        assert await second.robots_answer("https://b.test:8443") is None
        assert await second.robots_answer("http://a.test") == (b"\x00rules\xff", 500.0)
        await second.keep_robots_answer("http://a.test", b"newer", 30.0)  # fetched again
        assert await first.robots_answer("http://a.test") == (b"newer", 30.0)
        await second.keep_robots_answer("http://c.test", b"x" * MAX_ROBOTS_ANSWER, 30.0)
        assert await first.robots_answer("http://c.test") == (b"x" * MAX_ROBOTS_ANSWER, 30.0)
        clock.advance(31)
        assert await first.robots_answer("http://a.test") is None

        bad: list[tuple[str, bytes, float]] = [
            ("", b"rules", 1.0),
            ("http://a.test", b"x" * (MAX_ROBOTS_ANSWER + 1), 1.0),
            ("http://a.test", "rules", 1.0),  # type: ignore[list-item]
            ("http://a.test", b"rules", 0.0),
            ("http://a.test", b"rules", -1.0),
            ("http://a.test", b"rules", float("nan")),
        ]
        for origin, answer, seconds in bad:
            with pytest.raises(ConfigError):
                await first.keep_robots_answer(origin, answer, seconds)
    finally:
        await first.close()
        await second.close()


def limit(concurrency: int, interval: float = 0.0) -> Limit:
    return Limit(concurrency=concurrency, interval=interval)


async def group_limit(backend: Backend, name: str) -> Limit:
    (group,) = await backend.group_stats(name, include_idle=True)
    return group.limit


async def test_no_group_means_no_limit(backend: Backend) -> None:
    await schedule(backend, "jobs", list(range(50)))
    assert len(await claim(backend, "jobs")) == 50


async def test_concurrent_claims_never_share_an_element(url: str, clock: ManualClock) -> None:
    backends = [open_backend(url, clock=clock) for _ in range(4)]
    for b in backends:
        await b.open()
    try:
        await backends[0].ensure_queues([config("jobs")])
        await schedule(backends[0], "jobs", list(range(400)))

        async def drain(b: Backend) -> list[str]:
            seen: list[str] = []
            while claimed := await claim(b, "jobs", limit=7):
                seen.extend(c.payload for c in claimed)
            return seen

        results = await asyncio.gather(*(drain(b) for b in backends))
        everything = [p for r in results for p in r]
        assert sorted(everything, key=int) == [str(i) for i in range(400)]
    finally:
        for b in backends:
            await b.close()


# -- 4. when nothing is claimable, say when something will be -----------------------------------


async def test_next_claimable_time_is_reported(backend: Backend, clock: ManualClock) -> None:
    result = await backend.claim(["jobs"], worker="w", limit=10, lease=30)
    assert (result.elements, result.next_at) == ([], None)
    await schedule(backend, "jobs", ["soon"], seconds=7)
    result = await backend.claim(["jobs"], worker="w", limit=10, lease=30)
    assert result.next_at == clock() + 7


async def test_next_claimable_time_follows_group_gates(
    backend: Backend, clock: ManualClock
) -> None:
    await backend.set_limits([LimitRule(pattern="slow.test", limit=Limit(interval=5))])
    await schedule(backend, "pages", [url("slow.test", 1), url("slow.test", 2)])
    await claim(backend)
    result = await backend.claim(["pages"], worker="w", limit=10, lease=60)
    assert result.next_at == clock() + 5


async def test_schedule_wakes_an_idle_listener(url: str, clock: ManualClock) -> None:
    from crawlq.types import WorkerInfo

    producer, consumer = open_backend(url, clock=clock), open_backend(url, clock=clock)
    await producer.open()
    await consumer.open()
    listener = await consumer.listen(["jobs"])
    try:
        await consumer.ensure_queues([config("jobs")])
        info = WorkerInfo(
            id="idle",
            host="h",
            pid=1,
            queues=("jobs",),
            started=clock(),
            heartbeat=clock(),
            wake_address=listener.address,
        )
        await consumer.register_worker(info)
        assert not listener.event.is_set()
        await schedule(producer, "jobs", ["wake up"])
        await asyncio.wait_for(listener.event.wait(), 10)
    finally:
        await listener.close()
        await producer.close()
        await consumer.close()


# -- 5. acks, failures with retries, dead letters ---------------------------------------------


async def test_ack_finishes_an_element(backend: Backend) -> None:
    await schedule(backend, "jobs", ["x"])
    taken = await claim(backend, "jobs")
    await backend.ack(taken)
    assert await counts(backend, "jobs") == NOTHING


async def test_finish_writes_follow_ups_acks_and_failures(
    backend: Backend, clock: ManualClock
) -> None:
    await schedule(backend, "jobs", ["done", "flaky"])
    done, flaky = sorted(await claim(backend, "jobs"), key=lambda c: c.payload)
    follow = [prepare(config("pages"), url("a.test", 1), due=clock())]
    retry = Failure(element=flaky, error="boom", retry_at=clock() + 4)
    await backend.finish(follow, [done], [retry])
    assert await counts(backend, "jobs") == {
        "total": 1,
        "due": 0,
        "delayed": 1,
        "running": 0,
        "dead": 0,
    }
    assert [json.loads(c.payload) for c in await claim(backend)] == [url("a.test", 1)]


async def test_finish_whose_follow_up_cannot_be_written_acks_nothing(
    backend: Backend, clock: ManualClock
) -> None:
    """The acks wait for their follow-ups: a task is never done while the work it handed on
    is lost; it stays leased, and the worker writes both again."""
    await schedule(backend, "jobs", ["x"])
    taken = await claim(backend, "jobs")
    follow = [replace(prepare(config("pages"), url("a.test"), due=clock()), queue="nowhere")]
    with pytest.raises(UnknownQueue):
        await backend.finish(follow, taken, [])
    assert (await counts(backend, "jobs"))["running"] == 1
    await backend.finish([], taken, [])
    assert (await counts(backend, "jobs"))["total"] == 0


async def test_failure_retries_at_the_given_time_counting_attempts(
    backend: Backend, clock: ManualClock
) -> None:
    await schedule(backend, "jobs", ["flaky"])
    (first,) = await claim(backend, "jobs")
    await backend.fail([Failure(element=first, error="boom", retry_at=clock() + 4)])
    assert (await counts(backend, "jobs"))["delayed"] == 1
    clock.advance(4)
    (second,) = await claim(backend, "jobs")
    assert second.attempt == 2


async def test_dead_letters_can_be_listed_requeued_and_purged(
    backend: Backend, clock: ManualClock
) -> None:
    await schedule(backend, "jobs", ["a", "b", "c"])
    for claimed in await claim(backend, "jobs"):
        await backend.fail(
            [Failure(element=claimed, error=f"bad {claimed.payload}", traceback="tb")]
        )
    assert (await counts(backend, "jobs"))["dead"] == 3
    assert (await counts(backend, "jobs"))["total"] == 0
    letters = await backend.dead_letters("jobs")
    assert sorted(d.error for d in letters) == ['bad "a"', 'bad "b"', 'bad "c"']
    assert {d.traceback for d in letters} == {"tb"}
    assert await backend.requeue_dead("jobs", ['"a"']) == 1
    (again,) = await claim(backend, "jobs")
    assert (again.payload, again.attempt) == ('"a"', 1)
    assert await backend.purge_dead("jobs", ['"b"']) == 1
    assert await backend.requeue_dead("jobs") == 1
    assert await backend.purge_dead("jobs") == 0
    assert (await counts(backend, "jobs"))["dead"] == 0
    with pytest.raises(UnknownQueue):
        await backend.dead_letters("nope")


async def test_dead_letters_that_died_at_once_are_listed_and_requeued_by_key(
    backend: Backend, clock: ManualClock
) -> None:
    """Newest first in the list, oldest first back in the queue; those that died at the same
    time (one batch of failures) by key."""
    await schedule(backend, "jobs", ["c", "a", "b"])
    for claimed in await claim(backend, "jobs", limit=3):
        await backend.fail([Failure(element=claimed, error="gone")])
    clock.advance(1)
    await schedule(backend, "jobs", ["first"])
    (claimed,) = await claim(backend, "jobs")
    await backend.fail([Failure(element=claimed, error="gone")])
    letters = await backend.dead_letters("jobs")
    assert [d.key for d in letters] == ['"first"', '"c"', '"b"', '"a"']
    assert await backend.requeue_dead("jobs") == 4
    again = await claim(backend, "jobs", limit=4)
    assert [c.key for c in again] == ['"a"', '"b"', '"c"', '"first"']


async def test_a_requeued_dead_letter_keeps_its_priority(
    backend: Backend, clock: ManualClock
) -> None:
    """It came back at priority 0, behind everything newer."""
    await schedule(backend, "jobs", ["urgent"], priority=100)
    (urgent,) = await claim(backend, "jobs")
    await backend.fail([Failure(element=urgent, error="gone")])
    await schedule(backend, "jobs", ["later"])
    assert await backend.requeue_dead("jobs") == 1
    first, second = await claim(backend, "jobs", limit=2)
    assert (first.payload, first.priority, second.payload) == ('"urgent"', 100, '"later"')


async def test_an_error_text_with_a_lone_surrogate_is_stored_escaped(
    backend: Backend, clock: ManualClock
) -> None:
    """A file name decoded with surrogateescape, in an exception's text: UTF-8 cannot hold
    it, and storing the failure raised UnicodeEncodeError, which a worker retried forever."""
    name = b"report-\xff.pdf".decode("utf-8", "surrogateescape")
    await schedule(backend, "jobs", ["a"])
    (claimed,) = await claim(backend, "jobs")
    await backend.fail([Failure(element=claimed, error=f"cannot parse {name}", traceback=name)])
    (letter,) = await backend.dead_letters("jobs")
    assert (letter.error, letter.traceback) == (
        "cannot parse report-\\udcff.pdf",
        "report-\\udcff.pdf",
    )


async def test_a_lapsed_block_then_a_claim_in_another_queue_of_the_group_leaves_it_sound(
    backend: Backend, clock: ManualClock
) -> None:
    """The other queue's row of the group still waits for the block's end, now past: a claim
    there files it anew. `check` took that for a broken frontier (and the fixture checks
    every test's store)."""
    await backend.set_limits([LimitRule(pattern="*", limit=Limit(concurrency=3))])
    await schedule(backend, "pages", [url("a.com", 1)])
    await schedule(backend, "logins", [url("a.com", 2)])
    await backend.block_group("a.com", clock() + 1, "429")
    clock.advance(1.5)
    assert [c.payload for c in await claim(backend, "pages")] == [json.dumps(url("a.com", 1))]
    assert await backend.check() == []
    assert [c.payload for c in await claim(backend, "logins")] == [json.dumps(url("a.com", 2))]


async def test_a_schedule_while_it_ran_wins_over_its_last_failure(
    backend: Backend, clock: ManualClock
) -> None:
    """It was dead-lettered and queued again at once; acked later, its dead letter stayed,
    and requeueing the letters ran the finished element once more."""
    await schedule(backend, "jobs", ["a"])
    (first,) = await claim(backend, "jobs")
    await schedule(backend, "jobs", ["a"], seconds=5)
    await backend.fail([Failure(element=first, error="gone for good")])
    assert await backend.dead_letters("jobs") == []
    counts_now = await counts(backend, "jobs")
    assert (counts_now["dead"], counts_now["delayed"]) == (0, 1)
    clock.advance(5)
    (again,) = await claim(backend, "jobs")
    assert again.attempt == 1


# -- 6. leases: heartbeats, expiry, release -----------------------------------------------------


async def test_an_expired_lease_returns_the_element_and_frees_its_slot(
    backend: Backend, clock: ManualClock
) -> None:
    await backend.set_limits([LimitRule(pattern="a.test", limit=Limit(concurrency=1))])
    await schedule(backend, "pages", [url("a.test", 1), url("a.test", 2)])
    (lost,) = await claim(backend, lease=10)
    clock.advance(9)
    assert await claim(backend) == []
    clock.advance(1.5)
    (again,) = await claim(backend, lease=10)
    assert (again.payload, again.attempt) == (lost.payload, 2)
    await backend.ack([lost])  # the lost run's late ack is stale: nothing changes
    assert (await counts(backend))["running"] == 1


async def test_heartbeats_keep_a_lease(backend: Backend, clock: ManualClock) -> None:
    from crawlq.types import WorkerInfo

    worker = WorkerInfo(id="w", host="h", pid=1, queues=("jobs",), started=clock(), heartbeat=0)
    await backend.register_worker(worker)
    await schedule(backend, "jobs", ["long"])
    taken = await claim(backend, "jobs", lease=10)
    for _ in range(5):
        clock.advance(8)
        await backend.heartbeat(worker, taken, 10)
    assert await claim(backend, "jobs") == []
    assert (await counts(backend, "jobs"))["running"] == 1
    (live,) = await backend.workers()
    assert live.heartbeat == clock()


async def test_each_element_is_leased_for_its_own_queues_lease(
    backend: Backend, clock: ManualClock
) -> None:
    """A worker running tasks of different leases: after a crash, a short task's element runs
    again once its own lease ran out, not the longest of the worker's tasks'."""
    from crawlq.types import WorkerInfo

    queues = ("jobs", "pages")
    worker = WorkerInfo(id="w", host="h", pid=1, queues=queues, started=clock(), heartbeat=0)
    await backend.register_worker(worker)
    await schedule(backend, "jobs", ["short"])
    await schedule(backend, "pages", [url("a.test", 1)])
    leases = {"jobs": 10.0, "pages": 100.0}
    taken = await claim(backend, queues, lease=leases)
    assert {c.queue: c.lease_until - c.claimed_at for c in taken} == pytest.approx(leases)
    clock.advance(8)
    await backend.heartbeat(worker, taken, leases)  # the last: the worker is gone
    clock.advance(10.5)
    (again,) = await claim(backend, queues, lease=leases)
    assert (again.queue, again.attempt) == ("jobs", 2)
    await backend.ack([again])
    clock.advance(88)  # 106.5 s after the claim: the page's lease was renewed until 108
    assert await claim(backend, queues, lease=leases) == []
    clock.advance(2)
    (page,) = await claim(backend, queues, lease=leases)
    assert (page.queue, page.attempt) == ("pages", 2)


async def test_a_claim_leasing_for_no_time_and_a_block_of_no_group_leave_the_store_sound(
    backend: Backend, clock: ManualClock
) -> None:
    """On Redis the first failed after the claim's writes (PX 0) and left the element
    running; the second made a group record for the "" of elements in no group."""
    await schedule(backend, "jobs", ["a"])
    (taken,) = await claim(backend, "jobs", lease=0)
    await backend.block_group("", clock() + 60, "nothing to block")
    assert await backend.check() == []
    await backend.ack([taken])  # a lease that ran out, not run again: the ack finishes it
    assert (await counts(backend, "jobs"))["total"] == 0


async def test_a_worker_forgotten_while_its_heartbeats_stalled_is_listed_again_by_the_next(
    backend: Backend, clock: ManualClock
) -> None:
    """A heartbeat only updated a registered worker: one pruned after 120 s of silence (a
    stopped process, a stalled write) was never listed again, nor woken."""
    from crawlq.types import WorkerInfo

    def info(name: str) -> WorkerInfo:
        return WorkerInfo(id=name, host="h", pid=1, queues=("jobs",), started=clock(), heartbeat=0)

    await backend.register_worker(info("w1"))
    clock.advance(121)
    await backend.register_worker(info("w2"))  # prunes the silent w1
    assert [w.id for w in await backend.workers()] == ["w2"]
    await backend.heartbeat(info("w1"), [], 60)
    assert sorted(w.id for w in await backend.workers()) == ["w1", "w2"]


async def test_ack_of_an_expired_but_not_rerun_element_finishes_it(
    backend: Backend, clock: ManualClock
) -> None:
    await schedule(backend, "jobs", ["slow"])
    taken = await claim(backend, "jobs", lease=5)
    clock.advance(6)
    await claim(backend, "logins")  # any claim returns expired leases
    await backend.ack(taken)
    assert (await counts(backend, "jobs"))["total"] == 0


async def test_a_late_ack_does_not_undo_a_schedule_made_after_its_lease_expired(
    backend: Backend, clock: ManualClock
) -> None:
    """A new schedule starts the element's attempts afresh, so the expired run's ack no
    longer holds its lease: the revisit stays (SPEC 3.2: a schedule is never lost to a run
    that started before it)."""
    await schedule(backend, "jobs", ["revisit"])
    taken = await claim(backend, "jobs", lease=5)
    clock.advance(6)
    await claim(backend, "logins")  # any claim returns expired leases
    await schedule(backend, "jobs", ["revisit"], seconds=3600)
    await backend.ack(taken)
    info = await backend.element("jobs", '"revisit"')
    assert info is not None
    assert (info.state, info.due, info.attempts) == ("delayed", clock() + 3600, 0)


async def test_a_dead_element_scheduled_anew_is_alive_again(backend: Backend) -> None:
    """One element, one place: its dead letter goes when it is scheduled again (as re-queueing
    it from the dead letters does), and a later success leaves no letter behind."""
    await schedule(backend, "jobs", ["doomed"])
    (first,) = await claim(backend, "jobs")
    await backend.fail([Failure(element=first, error="gone")])
    assert (await counts(backend, "jobs"))["dead"] == 1
    await schedule(backend, "jobs", ["doomed"])
    assert (await counts(backend, "jobs"))["dead"] == 0
    assert await backend.dead_letters("jobs") == []
    await backend.ack(await claim(backend, "jobs"))
    assert await counts(backend, "jobs") == NOTHING


async def test_release_returns_elements_at_once_without_counting_the_attempt(
    backend: Backend,
) -> None:
    await schedule(backend, "jobs", ["a", "b"])
    taken = await claim(backend, "jobs")
    await backend.release(taken)
    assert await counts(backend, "jobs") == {
        "total": 2,
        "due": 2,
        "delayed": 0,
        "running": 0,
        "dead": 0,
    }
    assert [c.attempt for c in await claim(backend, "jobs")] == [1, 1]


# -- 7. introspection --------------------------------------------------------------------------


async def test_counts_per_queue_and_group(backend: Backend, clock: ManualClock) -> None:
    await backend.set_limits([LimitRule(pattern="a.test", limit=Limit(concurrency=1, interval=3))])
    await schedule(backend, "pages", [url("a.test", i) for i in range(3)])
    await schedule(backend, "pages", [url("b.test", 1)], seconds=60)
    await claim(backend)
    assert await counts(backend) == {"total": 4, "due": 2, "delayed": 1, "running": 1, "dead": 0}
    clock.advance(60)
    assert (await counts(backend))["due"] == 3
    (a,) = await backend.group_stats("a.test")
    assert (a.queued, a.running, a.limit) == (2, 1, Limit(concurrency=1, interval=3))
    assert a.next_start == clock() - 60 + 3
    names = [g.name for g in await backend.group_stats()]
    assert names == ["a.test", "b.test"]


async def test_group_filters_read_globs_as_fnmatch_does(backend: Backend) -> None:
    await schedule(backend, "pages", [url("a.test", 1), url("b.test", 1), url("^c.test", 1)])

    async def names(pattern: str) -> list[str]:
        return [g.name for g in await backend.group_stats(pattern)]

    assert await names("[!a]*") == ["^c.test", "b.test"]
    assert await names("[^a]*") == ["^c.test", "a.test"]  # "^" is a plain character
    assert await names("[b-z].test") == ["b.test"]
    assert await names("[a") == []  # an unclosed "[" is a plain "["


async def test_one_element_can_be_looked_up_in_every_state(
    backend: Backend, clock: ManualClock
) -> None:
    await schedule(backend, "jobs", ["later"], seconds=60, priority=3)
    await schedule(backend, "jobs", ["now", "doomed"])
    later = await backend.element("jobs", '"later"')
    assert later is not None
    assert (later.state, later.due, later.priority, later.attempts) == (
        "delayed",
        clock() + 60,
        3,
        0,
    )
    taken = {c.payload: c for c in await claim(backend, "jobs")}
    running = await backend.element("jobs", '"now"')
    assert running is not None
    assert (running.state, running.attempts, running.worker) == ("running", 1, "test-worker")
    assert running.lease_until == clock() + 3600
    await backend.fail([Failure(element=taken['"doomed"'], error="gone", traceback="tb")])
    dead = await backend.element("jobs", '"doomed"')
    assert dead is not None and dead.dead is not None
    assert (dead.state, dead.error, dead.dead.traceback) == ("dead", "gone", "tb")
    clock.advance(61)
    due = await backend.element("jobs", '"later"')
    assert due is not None and due.state == "due"
    await backend.ack([taken['"now"']])
    assert await backend.element("jobs", '"now"') is None
    with pytest.raises(UnknownQueue):
        await backend.element("nope", '"now"')


async def test_an_elements_history_tells_each_attempt_and_how_it_ended(
    backend: Backend, clock: ManualClock
) -> None:
    await schedule(backend, "jobs", ["flaky"])
    (first,) = await claim(backend, "jobs")
    await backend.fail([Failure(element=first, error="timeout", retry_at=clock())])
    (second,) = await claim(backend, "jobs")
    await backend.release([second])
    await claim(backend, "jobs", lease=5)  # its lease runs out
    clock.advance(6)
    (fourth,) = await claim(backend, "jobs")
    running = await backend.element("jobs", '"flaky"')
    assert running is not None
    assert [(a.attempt, a.worker, a.outcome) for a in running.history] == [
        (1, "test-worker", "timeout"),
        (2, "test-worker", "released"),  # a released attempt is not counted: the next is 2 again
        (2, "test-worker", "lease expired"),
        (3, "test-worker", None),
    ]
    assert running.history[-1].claimed_at == clock()
    await backend.fail([Failure(element=fourth, error="gave up")])
    dead = await backend.element("jobs", '"flaky"')
    assert dead is not None and dead.state == "dead"
    assert [a.outcome for a in dead.history] == ["timeout", "released", "lease expired", "gave up"]


async def test_workers_show_their_slots_and_the_elements_they_hold(
    backend: Backend, clock: ManualClock
) -> None:
    from crawlq.types import WorkerInfo

    me = WorkerInfo(
        id="test-worker",
        host="h",
        pid=1,
        queues=("jobs",),
        started=clock(),
        heartbeat=0,
        concurrency=7,
    )
    await backend.register_worker(me)
    await schedule(backend, "jobs", ["a", "b", "c"])
    taken = await claim(backend, "jobs", limit=2)
    (live,) = await backend.workers()
    assert (live.running, live.concurrency) == (2, 7)
    held = await backend.worker_elements("test-worker")
    assert sorted(e.key for e in held) == sorted(c.key for c in taken)
    assert {e.state for e in held} == {"running"}
    await backend.ack(taken[:1])
    assert [e.key for e in await backend.worker_elements("test-worker")] == [taken[1].key]
    assert await backend.worker_elements("someone-else") == []


# -- 8. seen memory ----------------------------------------------------------------------------


async def test_seen_queue_never_schedules_a_finished_element_again(backend: Backend) -> None:
    await schedule(backend, "crawl", [url("a.test", 1)])
    await backend.ack(await claim(backend, "crawl"))
    skipped = await schedule(backend, "crawl", [url("a.test", 1), url("a.test", 2)])
    assert (skipped.added, skipped.skipped_seen) == (1, 1)
    revisit = await schedule(backend, "crawl", [url("a.test", 1)], revisit=True)
    assert revisit.added == 1


async def test_seen_does_not_stop_moving_a_queued_element(backend: Backend) -> None:
    await schedule(backend, "crawl", [url("a.test", 1)], seconds=100)
    moved = await schedule(backend, "crawl", [url("a.test", 1)])
    assert moved.moved == 1


# -- 9. bad input is refused and changes nothing ------------------------------------------------


async def test_bad_elements_are_refused_with_the_reason(backend: Backend) -> None:
    with pytest.raises(InvalidElement, match="not JSON"):
        await schedule(backend, "jobs", [{"when": object()}])  # type: ignore[dict-item]
    with pytest.raises(InvalidElement, match="not JSON"):
        await schedule(backend, "jobs", [float("nan")])
    with pytest.raises(InvalidElement, match="must be absolute http"):
        await schedule(backend, "pages", ["ftp://files.test/x"])
    with pytest.raises(InvalidElement, match="no host"):
        await schedule(backend, "pages", ["http:///nohost"])
    with pytest.raises(InvalidElement, match="more than"):
        await schedule(backend, "jobs", ["x" * 70_000])


async def test_a_batch_with_an_unknown_queue_changes_nothing(backend: Backend) -> None:
    good = prepare(config("jobs"), "kept?", due=backend.now())
    bad = prepare(QueueConfig(name="nope"), url("x.test"), due=backend.now())
    with pytest.raises(UnknownQueue, match="nope"):
        await backend.schedule([good, bad])
    assert (await counts(backend, "jobs"))["total"] == 0


async def test_limits_are_validated() -> None:
    with pytest.raises(ValueError, match="concurrency"):
        Limit(concurrency=0)
    with pytest.raises(ValueError, match="interval"):
        Limit(interval=-1)
    with pytest.raises(ConfigError, match="pattern"):
        from crawlq.limits import check_pattern

        check_pattern(" a ")


# -- the frontier stays true under churn ------------------------------------------------------


async def test_raising_the_priority_of_a_groups_only_element_puts_it_first(
    backend: Backend,
) -> None:
    """The element stays its sub-queue's head with the same due time; only its priority
    moves, and the claim across groups must see it."""
    await schedule(backend, "pages", [url("a.test", 1)])
    await schedule(backend, "pages", [url("b.test", 1)])
    assert (await schedule(backend, "pages", [url("b.test", 1)], priority=5)).moved == 1
    (first,) = await claim(backend, limit=1)
    assert first.group == "b.test" and first.priority == 5


async def test_the_store_stays_consistent_through_random_operations(
    backend: Backend, clock: ManualClock
) -> None:
    """Every kind of operation in random order, over two queues sharing their groups (pages,
    logins) and one without groups (jobs): moves in time and priority, full and blocked
    groups, leases running out, settles that come late. `check()` finds nothing wrong after
    each step, not only at the end (a wrong frontier row can heal before the end)."""
    import random

    rng = random.Random(11)
    await backend.set_limits(
        [
            LimitRule(pattern="*", limit=Limit(concurrency=1, interval=0.5)),
            LimitRule(pattern="h1.test", limit=Limit(concurrency=2)),
        ]
    )
    hosts = ["h0.test", "h1.test", "h2.test"]
    queues = ["pages", "logins", "jobs"]
    held: list[Claimed] = []
    for step in range(300):
        op = rng.random()
        if op < 0.3:
            batch = [url(rng.choice(hosts), rng.randrange(8)) for _ in range(rng.randrange(1, 4))]
            await schedule(
                backend,
                rng.choice(queues),
                batch,
                seconds=rng.choice([0, 0, 1, 5, 60]),
                priority=rng.choice([0, 0, 1, -1]),
                mode=rng.choice([Mode.OVERWRITE, Mode.OVERWRITE, Mode.ONLY_IF_EARLIER]),
            )
        elif op < 0.55:
            chosen = rng.sample(queues, rng.randrange(1, 4))
            claimed = await backend.claim(chosen, worker="w", limit=rng.randrange(1, 4), lease=5)
            held += claimed.elements
        elif op < 0.8 and held:
            element = held.pop(rng.randrange(len(held)))
            action = rng.random()
            if action < 0.5:
                await backend.ack([element])
            elif action < 0.65:
                await backend.release([element])
            elif action < 0.85:
                retry_at = clock() + rng.choice([0, 2])
                await backend.fail([Failure(element=element, error="x", retry_at=retry_at)])
            else:
                await backend.fail([Failure(element=element, error="dead")])
        elif op < 0.87:
            until = None if rng.random() < 0.5 else clock() + rng.choice([1, 10])
            await backend.block_group(rng.choice(hosts), until, "test" if until else None)
        else:
            clock.advance(rng.choice([0.25, 1, 3, 6]))  # 6 s: past a lease
        problems = await backend.check()
        assert problems == [], (step, problems)


async def test_frontier_matches_a_simple_model_under_random_operations(
    backend: Backend, clock: ManualClock
) -> None:
    """Random schedules, claims, acks, failures and clock moves; compared with a plain model."""
    import random

    rng = random.Random(7)
    await backend.set_limits(
        [
            LimitRule(pattern="*", limit=Limit(concurrency=2, interval=0.5)),
            LimitRule(pattern="h0.test", limit=Limit(concurrency=1, interval=2)),
        ]
    )
    hosts = [f"h{i}.test" for i in range(4)]
    running: dict[str, Claimed] = {}
    last_start: dict[str, float] = {}
    for _ in range(400):
        op = rng.random()
        if op < 0.4:
            batch = [url(rng.choice(hosts), rng.randrange(30)) for _ in range(rng.randrange(1, 6))]
            await schedule(backend, "pages", batch, seconds=rng.choice([0, 0, 1, 3]))
        elif op < 0.7:
            for c in await claim(backend, limit=rng.randrange(1, 5)):
                in_group = [r for r in running.values() if r.group == c.group]
                limit = 1 if c.group == "h0.test" else 2
                gap = 2 if c.group == "h0.test" else 0.5
                assert len(in_group) < limit
                assert c.claimed_at - last_start.get(c.group, -1e9) >= gap
                assert c.payload not in running
                last_start[c.group] = c.claimed_at
                running[c.payload] = c
        elif op < 0.9 and running:
            key = rng.choice(sorted(running))
            done = running.pop(key)
            if rng.random() < 0.8:
                await backend.ack([done])
            else:
                failure = Failure(element=done, error="x", retry_at=clock() + 1)
                await backend.fail([failure])
        else:
            clock.advance(rng.choice([0.25, 0.5, 1, 2]))
    stats = await counts(backend)
    assert stats["running"] == len(running)
    groups = {g.name: g for g in await backend.group_stats(include_idle=True)}
    for host in hosts:
        in_flight = sum(1 for r in running.values() if r.group == host)
        assert groups[host].running == in_flight
    result = await backend.claim(["pages"], worker="w", limit=1000, lease=30)
    assert result.next_at is None or result.next_at < NEVER
