"""Limit rules: an index of exact names and globs resolves every group as a scan of all the
rules does, and a crawler reads them once for all its tasks."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Collection
from pathlib import Path

import pytest

from crawlq import App, ConfigError
from crawlq.backends import open_backend
from crawlq.crawl.politeness import Politeness
from crawlq.limits import DEFAULT_LIMIT, RuleIndex, is_exact, resolve
from crawlq.types import Limit, LimitRule


def test_the_index_resolves_as_the_scan_of_every_rule() -> None:
    rng = random.Random(5)
    alphabet = "ab.-*?[]!"
    patterns = {
        "".join(rng.choice(alphabet) for _ in range(rng.randrange(1, 6))) for _ in range(300)
    }
    rules = [
        LimitRule(pattern=p, limit=Limit(concurrency=n + 1)) for n, p in enumerate(sorted(patterns))
    ]
    groups = {
        "".join(rng.choice("ab.-[]!*?") for _ in range(rng.randrange(1, 5))) for _ in range(500)
    }
    index = RuleIndex(rules)

    assert len(index) == len(rules)
    assert {r.pattern for r in index.globs} == {p for p in patterns if not is_exact(p)}
    assert index.exact  # the alphabet makes both kinds
    for group in sorted(groups | patterns):
        assert index.resolve(group) == resolve(group, rules), group


def test_an_exact_rule_beats_the_globs_that_match_its_group() -> None:
    index = RuleIndex(
        [
            LimitRule(pattern="*", limit=Limit(concurrency=4)),
            LimitRule(pattern="*.example.org", limit=Limit(concurrency=2)),
            LimitRule(pattern="www.example.org", limit=Limit(concurrency=1, interval=5)),
        ]
    )
    assert index.resolve("www.example.org") == Limit(concurrency=1, interval=5)
    assert index.resolve("api.example.org") == Limit(concurrency=2)
    assert index.resolve("example.com") == Limit(concurrency=4)
    assert RuleIndex([]).resolve("example.com") == DEFAULT_LIMIT


async def test_a_crawler_reads_the_rules_once_for_every_task_that_asks_meanwhile(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """And the stored Crawl-delays of just the groups asked for, in one call: a broad crawl
    stores one for every host whose robots.txt asks, too many for every worker to read all."""
    backend = open_backend(f"sqlite:///{tmp_path / 'queue.db'}")
    await backend.open()
    try:
        await backend.set_limits([LimitRule(pattern="slow.test", limit=Limit(interval=2.0))])
        await backend.raise_crawl_delays({"h7.test": 3.0, "elsewhere.test": 9.0})
        reads = 0
        delay_reads: list[set[str] | None] = []
        limits, crawl_delays = backend.limits, backend.crawl_delays

        async def counted() -> list[LimitRule]:
            nonlocal reads
            reads += 1
            return await limits()

        async def counted_delays(groups: Collection[str] | None = None) -> dict[str, float]:
            delay_reads.append(None if groups is None else set(groups))
            return await crawl_delays(groups)

        monkeypatch.setattr(backend, "limits", counted)
        monkeypatch.setattr(backend, "crawl_delays", counted_delays)
        politeness = Politeness(backend)
        hosts = [f"h{n}.test" for n in range(50)] + ["slow.test"]
        intervals = await asyncio.gather(*(politeness.interval(h) for h in hosts))
        again = await asyncio.gather(*(politeness.interval(h) for h in hosts))
    finally:
        await backend.close()
    assert reads == 1  # as at a crawl's start, when every task asks at once
    assert delay_reads == [set(hosts)]
    assert intervals == again == [0.0] * 7 + [3.0] + [0.0] * 42 + [2.0]


async def test_a_worker_paces_by_the_crawl_delay_another_worker_read(tmp_path: Path) -> None:
    """A worker meeting a host after another process read its robots.txt paces even its own
    robots.txt request by the Crawl-delay, before it has read robots.txt itself."""
    backend = open_backend(f"sqlite:///{tmp_path / 'queue.db'}")
    await backend.open()
    try:
        first, second = Politeness(backend), Politeness(backend)
        await first.crawl_delay("slow.test", 10.0)
        intervals = [await second.interval("slow.test"), await second.interval("fast.test")]
    finally:
        await backend.close()
    assert intervals == [10.0, 0.0]


async def test_a_group_asked_for_again_while_its_lookup_is_out_is_not_looked_up_twice(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    backend = open_backend(f"sqlite:///{tmp_path / 'queue.db'}")
    await backend.open()
    try:
        await backend.raise_crawl_delays({"slow.test": 4.0})
        crawl_delays, answer = backend.crawl_delays, asyncio.Event()
        calls = 0

        async def held(groups: Collection[str] | None = None) -> dict[str, float]:
            nonlocal calls
            calls += 1
            await answer.wait()
            return await crawl_delays(groups)

        monkeypatch.setattr(backend, "crawl_delays", held)
        politeness = Politeness(backend)
        asks = []
        for _ in range(5):  # five loop turns, the first one's lookup still out
            asks.append(asyncio.ensure_future(politeness.interval("slow.test")))
            await asyncio.sleep(0)
        answer.set()
        intervals = await asyncio.gather(*asks)
    finally:
        await backend.close()
    assert (calls, intervals) == (1, [4.0] * 5)


async def test_rules_read_again_during_a_lookup_give_the_interval(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The interval is worked out from the rules read last, not from those in force when the
    Crawl-delay lookup went out."""
    backend = open_backend(f"sqlite:///{tmp_path / 'queue.db'}")
    await backend.open()
    try:
        await backend.set_limits([LimitRule(pattern="r.test", limit=Limit(interval=1.0))])
        politeness = Politeness(backend)
        await politeness.interval("other.test")  # the rules are read
        crawl_delays, answer = backend.crawl_delays, asyncio.Event()

        async def held(groups: Collection[str] | None = None) -> dict[str, float]:
            await answer.wait()
            return await crawl_delays(groups)

        monkeypatch.setattr(backend, "crawl_delays", held)
        asked = asyncio.ensure_future(politeness.interval("r.test"))
        while not politeness._in_flight:  # the lookup is out
            await asyncio.sleep(0)
        await backend.set_limits([LimitRule(pattern="r.test", limit=Limit(interval=9.0))])
        monkeypatch.setattr(politeness, "_limits_read", 0.0)  # the rules' time is up
        rereading = asyncio.ensure_future(politeness.interval("z.test"))
        while not politeness._limits_read:  # read again, the lookup still out
            await asyncio.sleep(0)
        answer.set()
        interval, _ = await asyncio.gather(asked, rereading)
    finally:
        await backend.close()
    assert interval == 9.0


def test_a_rule_with_more_than_one_star_before_its_end_is_refused(tmp_path: Path) -> None:
    """Redis matches rules by backtracking: `*?*?*?*?*?*?*?*?#` took seconds over one name,
    with every worker held; runs of * are one, and one before the end is fine."""
    app = App(f"sqlite:///{tmp_path / 'q.db'}")
    for pattern in ("*?*?*?*?*?*?*?*?#", "*shop*.com", "a*b*c"):
        with pytest.raises(ConfigError, match="more than one \\* before its end"):
            app.limit(pattern, concurrency=1)
    for pattern in ("*.example.com", "shop.*", "*shop*", "*", "a?b*", "**.gov**"):
        app.limit(pattern, concurrency=1)
    assert sorted(app.limit_rules) == ["*", "*.example.com", "*.gov*", "*shop*", "a?b*", "shop.*"]
