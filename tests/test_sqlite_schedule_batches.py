"""The SQLite engine applies a group commit's batches that share no element in one pass of
its batch statements. Each batch must still get what it would have got applied alone, in
turn, and leave the queue as that would: checked against applying them one at a time."""

from __future__ import annotations

import tempfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from crawlq.backends.sqlite.engine import BatchRow, Engine
from crawlq.backends.sqlite.store import Store
from crawlq.types import Limit, LimitRule, Mode, QueueConfig, Schedule

from .helpers import ManualClock

QUEUES = [QueueConfig(name="crawl", seen=True), QueueConfig(name="jobs")]
KEYS = [f"http://h{n % 3}.test/page/{n}" for n in range(8)]


def item(queue: str, n: int, due: float, mode: Mode, priority: int, revisit: bool) -> Schedule:
    key = KEYS[n]
    return Schedule(
        queue=queue,
        key=key,
        payload=None if priority % 2 else f'{{"url": "{key}", "p": {priority}}}',
        group=key.split("/")[2],
        due=due,
        priority=priority,
        mode=mode,
        revisit=revisit,
    )


schedules = st.builds(
    item,
    st.sampled_from(["crawl", "jobs"]),
    st.integers(0, len(KEYS) - 1),
    st.sampled_from([990.0, 1000.0, 1005.0, 1010.0]),
    st.sampled_from(list(Mode)),
    st.integers(0, 3),
    st.booleans(),
)
batches = st.lists(st.lists(schedules, min_size=1, max_size=4), min_size=1, max_size=6)


@contextmanager
def engine_with_history() -> Iterator[Engine]:
    """An engine whose queues hold every state: queued, delayed, running, seen (finished)."""
    with tempfile.TemporaryDirectory() as folder:
        engine = Engine(Store(str(Path(folder) / "queue.db"), create=True), ManualClock(1000.0))
        engine.ensure_queues(QUEUES)
        engine.set_limits([LimitRule(pattern="*", limit=Limit())])
        for queue in ("crawl", "jobs"):
            engine.schedule([item(queue, n, 1000.0, Mode.OVERWRITE, 0, False) for n in range(4)])
            engine.schedule([item(queue, 4, 1020.0, Mode.OVERWRITE, 0, False)])
            result, _ = engine.claim([queue], "w", 2, 60.0)
            engine.ack(result.elements[:1])  # done: seen in the crawl queue; one left running
        try:
            yield engine
        finally:
            engine.store.close()


def state(engine: Engine) -> list[object]:
    elements = [engine.element(queue.name, key) for queue in QUEUES for key in KEYS]
    groups = engine.group_stats("*", 100, True)
    return [elements, engine.queue_stats(None), groups, engine.check()]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(batches)
def test_batches_together_do_what_each_would_in_turn(batches: list[list[Schedule]]) -> None:
    with engine_with_history() as together, engine_with_history() as alone:
        results, _ = together.schedule_batches(batches)
        expected = [alone.schedule(batch)[0] for batch in batches]
        assert results == expected
        assert state(together) == state(alone)


def test_disjoint_batches_of_every_outcome_share_one_pass() -> None:
    """Added, moved, deferred (running), kept and skipped (seen) in one commit of five
    batches, none sharing a key: one pass, and each batch has its own counts."""
    with engine_with_history() as engine:
        passes = []
        apply = engine._apply_batch

        def counted(rows: Sequence[BatchRow], now: float, parts: int = 1) -> list[list[int]]:
            passes.append(parts)
            return apply(rows, now, parts)

        engine._apply_batch = counted  # type: ignore[method-assign]
        earlier = Mode.ONLY_IF_EARLIER
        results, _ = engine.schedule_batches(
            [
                [item("crawl", 6, 1000.0, Mode.ONLY_IF_NEW, 0, False)],  # new
                [item("crawl", 3, 990.0, earlier, 0, False)],  # queued, moved earlier
                [item("crawl", 1, 1005.0, Mode.OVERWRITE, 0, False)],  # running: deferred
                [item("crawl", 2, 1010.0, earlier, 0, False)],  # queued, kept
                [item("crawl", 0, 1000.0, Mode.ONLY_IF_NEW, 0, False)],  # seen: skipped
            ]
        )
        assert passes == [5]
        outcomes = [(r.added, r.moved, r.deferred, r.kept, r.skipped_seen) for r in results]
        assert outcomes == [
            (1, 0, 0, 0, 0),
            (0, 1, 0, 0, 0),
            (0, 0, 1, 0, 0),
            (0, 0, 0, 1, 0),
            (0, 0, 0, 0, 1),
        ]


def test_a_batch_sharing_a_key_with_an_earlier_one_waits_for_its_pass() -> None:
    with engine_with_history() as engine:
        results, _ = engine.schedule_batches(
            [
                [item("jobs", 6, 1000.0, Mode.ONLY_IF_NEW, 0, False)],
                [item("jobs", 7, 1000.0, Mode.ONLY_IF_NEW, 0, False)],
                [item("jobs", 6, 1005.0, Mode.OVERWRITE, 0, False)],  # sees the first's add
            ]
        )
        assert [(r.added, r.moved) for r in results] == [(1, 0), (1, 0), (0, 1)]
        found = engine.element("jobs", KEYS[6])
        assert found is not None and found.due == 1005.0
