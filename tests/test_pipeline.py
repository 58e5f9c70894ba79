"""The results store (real SQLite files), its exports, and a pipeline's declaration rules."""

from __future__ import annotations

import csv
import json
import os
from collections.abc import Iterator, Sequence
from pathlib import Path

import pyarrow.parquet as pq
import pytest

import crawlq
from crawlq.errors import ConfigError
from crawlq.pipeline import Pipeline, Record, StoredResponse
from crawlq.results import ResultsStore, export
from crawlq.results.store import KeyConflict
from crawlq.types import JSON, Claimed, Failure, GroupBy, Schedule, WorkerInfo


@pytest.fixture
def store(tmp_path: Path) -> Iterator[ResultsStore]:
    with ResultsStore(tmp_path / "results.sqlite") as opened:
        yield opened


def sale(key: str, **data: JSON) -> Record:
    return Record(type="sale", key=key, data=dict(data))


def test_records_are_stored_by_key_one_table_per_type(store: ResultsStore) -> None:
    store.replace("parse", "a.html", [sale("1", units=3), Record(type="note", key="n", data={})])
    store.replace("parse", "b.html", [sale("2", units=5, region="eu")])
    with pytest.raises(KeyConflict):  # same key from another stage: refused, not taken over
        store.replace("other", "c.html", [sale("1", units=7)])
    store.replace("other", "c.html", [sale("3", units=7)])
    assert list(store.rows("sale")) == [
        {"key": "1", "units": 3, "region": None},
        {"key": "2", "units": 5, "region": "eu"},
        {"key": "3", "units": 7, "region": None},
    ]
    assert store.types() == ["note", "sale"]
    assert store.count("sale") == 3
    assert store.done() == {"parse": 2, "other": 1}


def test_a_stage_output_is_replaced_whole_so_reruns_leave_the_same_rows(
    store: ResultsStore,
) -> None:
    first = [sale("a#0", units=1), sale("a#1", units=2), sale("a#2", units=3)]
    store.replace("parse", "a", first)
    store.replace("parse", "b", [sale("b#0", units=9)])
    store.replace("parse", "a", first)
    assert [r["key"] for r in store.rows("sale")] == ["a#0", "a#1", "a#2", "b#0"]
    # a changed parser that finds fewer rows: the stale one goes, b is untouched
    store.replace("parse", "a", [sale("a#0", units=10), sale("a#1", units=20)])
    assert [(r["key"], r["units"]) for r in store.rows("sale")] == [
        ("a#0", 10),
        ("a#1", 20),
        ("b#0", 9),
    ]
    assert [r.key for r in store.records("parse", "a")] == ["a#0", "a#1"]
    assert store.refs("parse") == ["a", "b"]


def test_nested_values_read_back_and_bad_names_are_refused(store: ResultsStore) -> None:
    store.replace("parse", "x", [sale("k", tags=["a", "b"], price={"eur": 1.5})])
    row = next(store.rows("sale"))
    assert row["tags"] == ["a", "b"]
    assert row["price"] == {"eur": 1.5}
    with pytest.raises(ConfigError, match="record type 'bad name'"):
        Record(type="bad name", key="k")
    with pytest.raises(ConfigError, match="'x; DROP TABLE sale'"):
        Record(type="sale", key="k", data={"x; DROP TABLE sale": 1})
    with pytest.raises(ConfigError, match="reserved"):
        Record(type="sale", key="k", data={"key": 1})


def test_exports_to_jsonl_csv_and_parquet_hold_the_same_rows(
    store: ResultsStore, tmp_path: Path
) -> None:
    store.replace("n", "r1", [sale("b", units=2, region="eu"), sale("a", units=1)])
    store.replace("n", "r2", [sale("c", units=3, revenue=4.5)])
    expected = [
        {"key": "a", "units": 1, "region": None, "revenue": None},
        {"key": "b", "units": 2, "region": "eu", "revenue": None},
        {"key": "c", "units": 3, "region": None, "revenue": 4.5},
    ]
    assert export(store, "sale", tmp_path / "s.jsonl") == 3
    lines = (tmp_path / "s.jsonl").read_text().splitlines()
    assert [json.loads(line) for line in lines] == expected
    assert export(store, "sale", tmp_path / "s.csv") == 3
    with (tmp_path / "s.csv").open() as file:
        rows = list(csv.DictReader(file))
    assert rows[2] == {"key": "c", "units": "3", "region": "", "revenue": "4.5"}
    assert export(store, "sale", tmp_path / "out" / "s.parquet") == 3
    assert pq.read_table(tmp_path / "out" / "s.parquet").to_pylist() == expected
    with pytest.raises(ConfigError, match="no record type 'nope'"):
        export(store, "nope", tmp_path / "x.csv")
    with pytest.raises(ConfigError, match="export format 'xlsx'"):
        export(store, "sale", tmp_path / "x.xlsx")


def test_a_pipeline_declares_its_fetch_stage_first_and_refuses_to_reprocess_it(
    tmp_path: Path,
) -> None:
    app = crawlq.App(f"sqlite:///{tmp_path / 'q.db'}")
    pipeline = Pipeline(app, data=tmp_path / "data")

    with pytest.raises(ConfigError, match="declare the fetch stage first"):

        @pipeline.stage()
        def too_early(ctx: crawlq.SyncContext, stored: StoredResponse) -> None: ...

    @pipeline.fetch()
    async def download(ctx: crawlq.Context, url: str) -> None:
        return None

    @pipeline.stage()
    def parse(ctx: crawlq.SyncContext, stored: StoredResponse) -> list[Record]:
        return []

    assert [s.name for s in pipeline.stages] == ["download", "parse"]
    assert app.tasks["parse"].options.group_by is GroupBy.NONE
    assert app.tasks["download"].options.group_by is GroupBy.HOST
    with pytest.raises(ConfigError, match="is the fetch stage"):
        pipeline.inputs("download")
    with pytest.raises(ConfigError, match="no stage 'publish'"):
        pipeline.inputs("publish")
    with pytest.raises(ConfigError, match="already has a pipeline"):
        Pipeline(app, data=tmp_path / "other")
    pipeline.results.replace("download", "http://a.test/1.csv", [])
    pipeline.results.replace("download", "http://a.test/2.html", [])
    assert pipeline.inputs("parse", ["*.csv"]) == ["http://a.test/1.csv"]
    assert pipeline.of(app) is pipeline
    pipeline.results.close()


async def test_follow_up_work_is_written_with_the_ack_and_only_on_success(
    tmp_path: Path,
) -> None:
    """`ctx.schedule_with_ack` (how a stage schedules the next): the follow-up is written in
    the same backend call as the task's ack (one SQLite transaction), and a failed attempt
    schedules nothing."""
    app = crawlq.App(f"sqlite:///{tmp_path / 'q.db'}")
    ran: list[int] = []

    @app.task()
    async def after(ctx: crawlq.Context, n: int) -> None:
        ran.append(n)

    @app.task(retry=crawlq.Retry(max_attempts=2, base=0, jitter=0))
    async def first(ctx: crawlq.Context, n: int) -> None:
        await ctx.schedule_with_ack(after, [n * 10 + ctx.attempt])
        if ctx.attempt == 1 and n % 2:
            raise RuntimeError("fails once")

    backend = await app.backend()
    finished = backend.finish
    followed_with_ack: list[bool] = []

    async def finish(
        follow: Sequence[Schedule], acks: Sequence[Claimed], failures: Sequence[Failure]
    ) -> None:
        keys = {item.key for item in follow}
        for element in acks:
            if element.queue == "first":
                expected = json.loads(element.payload) * 10 + element.attempt
                followed_with_ack.append(str(expected) in keys)
        await finished(follow, acks, failures)

    backend.finish = finish  # type: ignore[method-assign]
    try:
        await app.aschedule_many(first, list(range(10)))
        stats = await crawlq.Worker(app, burst=True, burst_horizon=1).run()
        assert stats.by_queue == {"first": 10, "after": 10}
        assert stats.failed == 5
        # the follow-ups of the succeeding attempts (the first for even n, the second for odd)
        assert sorted(ran) == sorted(n * 10 + 1 + n % 2 for n in range(10))
        assert followed_with_ack == [True] * 10
    finally:
        await app.aclose()


def _three_stages(tmp_path: Path) -> tuple[Pipeline, list[str]]:
    """download -> parse -> total, parse's records already stored for three inputs; total
    refuses the input named bad for good; the finish step notes that it ran."""
    app = crawlq.App(f"sqlite:///{tmp_path / 'q.db'}")
    pipeline = Pipeline(app, data=tmp_path / "data")
    finished: list[str] = []

    @pipeline.fetch()
    async def download(ctx: crawlq.Context, url: str) -> None:
        return None

    @pipeline.stage()
    def parse(ctx: crawlq.SyncContext, stored: StoredResponse) -> list[Record]:
        return []

    @pipeline.stage(retry=crawlq.Retry(max_attempts=2, base=0.01, cap=0.01, jitter=0))
    def total(ctx: crawlq.SyncContext, stored: list[Record]) -> list[Record]:
        if any(r.key == "bad" for r in stored):
            raise crawlq.Permanent("no total for bad")
        units = sum(int(str(r.data["units"])) for r in stored)
        return [Record(type="total", key=stored[0].key, data={"units": units})]

    @pipeline.finish
    def publish(results: ResultsStore) -> None:
        finished.append("report")

    for ref in ("a", "b", "bad"):
        pipeline.results.replace("parse", ref, [sale(ref, units=2)])
    return pipeline, finished


async def test_a_reprocess_whose_inputs_died_publishes_nothing(tmp_path: Path) -> None:
    pipeline, finished = _three_stages(tmp_path)
    try:
        result = await pipeline.reprocess("total")
    finally:
        await pipeline.app.aclose()
        pipeline.results.close()
    assert result.worker is not None and (result.worker.done, result.worker.dead) == (2, 1)
    assert not result.finished and finished == []


async def test_a_reprocess_refuses_queues_that_running_workers_serve(tmp_path: Path) -> None:
    """They would run part of it with the code they loaded: old code beside the new."""
    pipeline, finished = _three_stages(tmp_path)
    try:
        backend = await pipeline.app.backend()
        now = backend.now()
        other = WorkerInfo(
            id="w1", host="h", pid=4242, queues=("total",), started=now, heartbeat=now
        )
        await backend.register_worker(other)
        with pytest.raises(ConfigError, match=r"1 worker\(s\) serve queue\(s\) total \(pid 4242"):
            await pipeline.reprocess("total")
        (stats,) = await backend.queue_stats(["total"])
        assert stats.total == 0  # nothing was scheduled
        left = await pipeline.reprocess("total", run=False)  # for the running workers
        assert left.scheduled == 3 and left.worker is None
    finally:
        await pipeline.app.aclose()
        pipeline.results.close()
    assert finished == []


async def test_a_stage_is_recorded_done_only_once_its_records_are_on_disk(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The results store's commits are not synced one by one: before a worker records a
    batch of elements done, the write-ahead log holding their records is fsynced."""
    synced: list[str] = []
    fsync = os.fsync

    def noting(fd: int) -> None:
        fsync(fd)
        synced.append(os.readlink(f"/proc/self/fd/{fd}"))

    monkeypatch.setattr(os, "fsync", noting)
    pipeline, _ = _three_stages(tmp_path)
    wal = str(pipeline.results.path) + "-wal"
    seen: list[tuple[int, int]] = []  # elements recorded done, and the log's syncs before
    try:
        backend = await pipeline.app.backend()
        finish = backend.finish

        async def finish_seen(
            follow: list[Schedule], acks: list[Claimed], failures: list[Failure]
        ) -> None:
            seen.append((len(acks), synced.count(wal)))
            await finish(follow, acks, failures)

        monkeypatch.setattr(backend, "finish", finish_seen)
        await pipeline.reprocess("total", where=["a", "b"])
    finally:
        await pipeline.app.aclose()
        pipeline.results.close()
    assert sum(done for done, _ in seen) == 2
    assert all(syncs >= 1 for done, syncs in seen if done)
