"""Limit rules: an index of exact names and globs resolves every group as a scan of all the
rules does, and a crawler reads them once for all its tasks."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Collection
from pathlib import Path

import pytest

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
