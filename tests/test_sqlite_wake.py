"""The SQLite engine wakes only the workers of the queues that got claimable work: in a
pipeline, the parse stage's writes must not make the fetch stage's workers claim for nothing."""

from __future__ import annotations

from pathlib import Path

from crawlq.backends.sqlite.engine import Engine
from crawlq.backends.sqlite.store import Store
from crawlq.tasks import prepare
from crawlq.types import Limit, LimitRule, Mode, WorkerInfo

from .helpers import ManualClock, config, url

FETCH, PARSE = config("fetch"), config("parse")


def engine_with_workers(path: Path, clock: ManualClock) -> Engine:
    engine = Engine(Store(str(path), create=True), clock)
    engine.ensure_queues([FETCH, PARSE])
    for name, queues in [
        ("fetcher", ("fetch",)),
        ("parser", ("parse",)),
        ("both", ("parse", "fetch")),
    ]:
        engine.register_worker(
            WorkerInfo(
                id=name,
                host="h",
                pid=1,
                queues=queues,
                started=clock(),
                heartbeat=clock(),
                wake_address=f"addr-{name}",
            )
        )
    return engine


def test_a_schedule_wakes_the_workers_of_its_queue(tmp_path: Path, clock: ManualClock) -> None:
    engine = engine_with_workers(tmp_path / "queue.db", clock)
    try:
        _, wake = engine.schedule([prepare(PARSE, url("a.test", 1), due=clock())])
        assert sorted(wake) == ["addr-both", "addr-parser"]
        _, wake = engine.schedule([prepare(FETCH, url("a.test", 2), due=clock())])
        assert sorted(wake) == ["addr-both", "addr-fetcher"]
        again = prepare(FETCH, url("a.test", 2), due=clock(), mode=Mode.ONLY_IF_NEW)
        _, wake = engine.schedule([again])
        assert wake == []  # already queued: nothing changed, nobody to wake
    finally:
        engine.store.close()


def test_a_slot_freed_in_one_queue_wakes_the_queue_waiting_on_the_group(
    tmp_path: Path, clock: ManualClock
) -> None:
    """Groups span queues: finishing a fetch of a.test lets the parse queue's a.test work run."""
    engine = engine_with_workers(tmp_path / "queue.db", clock)
    try:
        engine.set_limits([LimitRule(pattern="a.test", limit=Limit(concurrency=1))])
        engine.schedule([prepare(FETCH, url("a.test", 1), due=clock())])
        claimed, _ = engine.claim(["fetch"], worker="fetcher", limit=10, lease=60)
        assert len(claimed.elements) == 1
        engine.schedule([prepare(PARSE, url("a.test", 2), due=clock())])
        assert engine.claim(["parse"], worker="parser", limit=10, lease=60)[0].elements == []
        assert sorted(engine.ack(claimed.elements)) == ["addr-both", "addr-parser"]
    finally:
        engine.store.close()
