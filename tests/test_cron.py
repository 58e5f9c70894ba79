"""Cron tasks: expressions read as Vixie cron reads them (time zones and DST included), and
workers on both backends that fire each occurrence once, however many of them start, catch
up once after a gap, and keep the chain going when an occurrence fails for good."""

from __future__ import annotations

import asyncio
import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from crawlq import App, ConfigError, Context, cron
from crawlq.cron import Cron, trigger
from crawlq.identity import canonical_json
from crawlq.types import Failure
from crawlq.worker import Worker

from .conftest import backend_url
from .helpers import ManualClock

GUARD = 60.0  # seconds: only a failing test waits this long


def at(text: str) -> float:
    return datetime.fromisoformat(text).timestamp()


def utc(moment: float) -> str:
    return datetime.fromtimestamp(moment, UTC).strftime("%Y-%m-%dT%H:%M")


@pytest.mark.parametrize(
    ("expression", "after", "expected"),
    [
        ("0 2 * * *", "2026-11-24T10:00Z", ["2026-11-25T02:00", "2026-11-26T02:00"]),
        ("*/15 * * * *", "2026-11-24T10:07:30Z", ["2026-11-24T10:15", "2026-11-24T10:30"]),
        ("5/20 9 * * *", "2026-11-24T09:30Z", ["2026-11-24T09:45", "2026-11-25T09:05"]),
        ("30 9 * * MON-FRI", "2026-11-27T10:00Z", ["2026-11-30T09:30", "2026-12-01T09:30"]),
        ("0 0 13 * 5", "2026-11-01T00:00Z", ["2026-11-06T00:00", "2026-11-13T00:00"]),
        ("0 0 13 * *", "2026-11-01T00:00Z", ["2026-11-13T00:00", "2026-12-13T00:00"]),
        ("0 0 * * 7", "2026-11-24T00:00Z", ["2026-11-29T00:00", "2026-12-06T00:00"]),
        ("0 0 29 feb *", "2026-01-01T00:00Z", ["2028-02-29T00:00", "2032-02-29T00:00"]),
        ("0 12 1 JAN,jul *", "2026-11-24T00:00Z", ["2027-01-01T12:00", "2027-07-01T12:00"]),
        ("@hourly", "2026-11-24T10:00Z", ["2026-11-24T11:00", "2026-11-24T12:00"]),
        ("@weekly", "2026-11-24T10:00Z", ["2026-11-29T00:00", "2026-12-06T00:00"]),
        ("@yearly", "2026-11-24T10:00Z", ["2027-01-01T00:00", "2028-01-01T00:00"]),
    ],
)
def test_next_times_are_those_vixie_cron_gives(
    expression: str, after: str, expected: list[str]
) -> None:
    cron = Cron.parse(expression)
    first = cron.next_after(at(after))
    assert [utc(first), utc(cron.next_after(first))] == expected


def test_a_zone_s_dst_changes_skip_an_hour_late_and_repeat_once() -> None:
    cron = Cron.parse("30 2 * * *", tz="Europe/Paris")
    # 2026-03-29: 02:00 CET becomes 03:00 CEST, so 02:30 is no time: it fires at 03:30 CEST.
    skipped = cron.next_after(at("2026-03-28T12:00Z"))
    assert utc(skipped) == "2026-03-29T01:30"
    assert utc(cron.next_after(skipped)) == "2026-03-30T00:30"  # 02:30 CEST
    # 2026-10-25: 03:00 CEST becomes 02:00 CET, so 02:30 comes twice: it fires the first time.
    first = cron.next_after(at("2026-10-24T12:00Z"))
    assert utc(first) == "2026-10-25T00:30"
    assert utc(cron.next_after(first)) == "2026-10-26T01:30"
    assert utc(cron.next_after(at("2026-10-25T01:15Z"))) == "2026-10-26T01:30"


@pytest.mark.parametrize(
    ("expression", "tz", "match"),
    [
        ("61 * * * *", "UTC", r"the minute field takes 0 to 59"),
        ("* * *", "UTC", r"expected 5 fields"),
        ("x * * * *", "UTC", r"'x' is no value of the minute field"),
        ("*/0 * * * *", "UTC", r"a step of the minute field must be at least 1"),
        ("0 0 5-1 * *", "UTC", r"low to high"),
        ("0 0 30 2 *", "UTC", r"matches no time in 8 years"),
        ("0 2 * * *", "Mars/Olympus", r"not an IANA time zone"),
    ],
)
def test_bad_expressions_are_refused_when_the_task_is_declared(
    tmp_path: Path, expression: str, tz: str, match: str
) -> None:
    app = App(f"sqlite:///{tmp_path / 'q.db'}")
    with pytest.raises(ConfigError, match=match):

        @app.task(cron=expression, cron_tz=tz)
        def nightly(ctx: Context, when: str) -> None: ...


def test_a_cron_task_takes_no_key_function(tmp_path: Path) -> None:
    app = App(f"sqlite:///{tmp_path / 'q.db'}")
    with pytest.raises(ConfigError, match="takes no key="):

        @app.task(cron="@daily", key=str)
        def nightly(ctx: Context, when: str) -> None: ...


class Job:
    """A cron app on a backend with a manual clock; `ran` holds the elements its task got."""

    def __init__(
        self,
        url: str,
        clock: ManualClock,
        *,
        fail: bool = False,
        lease: float = 60.0,
        expression: str = "0 2 * * *",
    ) -> None:
        self.clock = clock
        self.app = App(url, clock=clock)
        self.ran: list[Any] = []

        @self.app.task(cron=expression, max_attempts=1, lease=lease)
        def nightly(ctx: Context, when: str) -> None:
            self.ran.append(when)
            if fail:
                raise RuntimeError(f"the {when} run failed")

        self.task = nightly

    async def work(self) -> None:
        """A worker starts, runs what is due, and stops once nothing is due soon."""
        await Worker(self.app, burst=True, concurrency=4).run()

    @property
    def trigger(self) -> Any:
        schedule = self.task.options.cron
        assert schedule is not None
        return trigger("nightly", schedule)

    async def trigger_due_or_none(self) -> float | None:
        backend = await self.app.backend()
        info = await backend.element("nightly", canonical_json(self.trigger))
        return None if info is None or info.state != "delayed" else info.due

    async def trigger_due(self) -> float:
        due = await self.trigger_due_or_none()
        assert due is not None
        return due

    async def counts(self) -> tuple[int, int]:
        (stats,) = await (await self.app.backend()).queue_stats(["nightly"])
        return stats.total, stats.dead


@pytest.fixture(params=["sqlite", "redis"])
async def job_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    return backend_url(request.param, tmp_path, request)


async def test_each_occurrence_runs_once_however_many_workers_start(
    job_url: str,
) -> None:
    clock = ManualClock(at("2026-11-24T10:00Z"))
    job = Job(job_url, clock)
    try:
        for _ in range(3):  # three workers start: one trigger, nothing run
            await job.work()
        assert job.ran == []
        assert await job.counts() == (1, 0)
        assert await job.trigger_due() == at("2026-11-25T02:00Z")

        clock.t = at("2026-11-25T02:00:30Z")
        await job.work()
        await job.work()
        assert job.ran == ["2026-11-25T02:00:00Z"]
        assert await job.trigger_due() == at("2026-11-26T02:00Z")
        assert await job.counts() == (1, 0)

        # Workers were down for three nights: the first missed one runs, once, on return.
        clock.t = at("2026-11-29T05:00Z")
        await job.work()
        assert job.ran == ["2026-11-25T02:00:00Z", "2026-11-26T02:00:00Z"]
        assert await job.trigger_due() == at("2026-11-30T02:00Z")
        assert await (await job.app.backend()).check() == []
    finally:
        await job.app.aclose()


async def test_an_occurrence_that_fails_for_good_leaves_the_next_one_planned(
    job_url: str,
) -> None:
    clock = ManualClock(at("2026-11-24T10:00Z"))
    job = Job(job_url, clock, fail=True)
    try:
        await job.work()
        clock.t = at("2026-11-25T02:01Z")
        await job.work()
        assert job.ran == ["2026-11-25T02:00:00Z"]
        assert await job.counts() == (1, 1)  # the trigger queued; the occurrence dead
        backend = await job.app.backend()
        (dead,) = await backend.dead_letters("nightly")
        assert json.loads(dead.payload) == "2026-11-25T02:00:00Z"
        assert await job.trigger_due() == at("2026-11-26T02:00Z")

        clock.t = at("2026-11-26T02:00Z")
        await job.work()
        assert job.ran == ["2026-11-25T02:00:00Z", "2026-11-26T02:00:00Z"]
    finally:
        await job.app.aclose()


async def test_crawlq_start_runs_a_cron_task_now_beside_its_schedule(job_url: str) -> None:
    clock = ManualClock(at("2026-11-24T10:00Z"))
    job = Job(job_url, clock)
    try:
        await job.work()
        await job.app.aschedule(job.task, None)  # what `crawlq start` does
        await job.work()
        assert job.ran == [None]
        assert await job.trigger_due() == at("2026-11-25T02:00Z")
    finally:
        await job.app.aclose()


async def test_a_running_worker_plants_a_dead_lettered_trigger_again(
    job_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A trigger lost from its chain (dead-lettered when the backend failed in the middle of
    its run) comes back within cron.REPLANT_EVERY without a worker restart."""
    monkeypatch.setattr(cron, "REPLANT_EVERY", 0.0)
    clock = ManualClock(at("2026-11-24T10:00Z"))
    job = Job(job_url, clock, lease=0.6)  # heartbeats (and plantings) 0.2 s apart
    await job.work()
    backend = await job.app.backend()
    clock.t = at("2026-11-25T02:00Z")
    (claimed,) = (await backend.claim(["nightly"], worker="lost", limit=1, lease=60)).elements
    lost = Failure(element=claimed, error="Redis went away in the middle of the run")
    await backend.fail([lost])
    assert await job.counts() == (0, 1)
    worker = Worker(job.app, concurrency=1)
    running = asyncio.create_task(worker.run())
    try:
        async with asyncio.timeout(GUARD):
            while await job.trigger_due_or_none() != at("2026-11-26T02:00Z"):
                await asyncio.sleep(0.01)
        assert job.ran == []  # that night failed with its trigger: a dead letter
    finally:
        worker.stop()
        await running
        await job.app.aclose()


async def test_a_trigger_an_operator_moved_later_stays_there_to_skip_a_night(
    job_url: str,
) -> None:
    clock = ManualClock(at("2026-11-24T10:00Z"))
    job = Job(job_url, clock)
    try:
        await job.work()
        await job.app.aschedule(job.task, job.trigger, seconds=at("2026-11-26T02:00Z") - clock.t)
        await job.work()  # a worker starting plants its triggers
        await cron.plant([job.task], await job.app.backend())  # as a running one does
        assert await job.trigger_due() == at("2026-11-26T02:00Z")
        clock.t = at("2026-11-25T02:30Z")
        await job.work()
        assert job.ran == []
        clock.t = at("2026-11-26T02:00Z")
        await job.work()
        assert job.ran == ["2026-11-26T02:00:00Z"]
        assert await job.trigger_due() == at("2026-11-27T02:00Z")
    finally:
        await job.app.aclose()


async def test_a_changed_schedule_takes_effect_at_once_and_the_old_trigger_runs_nothing(
    job_url: str,
) -> None:
    clock = ManualClock(at("2026-11-24T10:00Z"))
    before = Job(job_url, clock)  # every night at 02:00
    await before.work()
    await before.app.aclose()
    after = Job(job_url, clock, expression="0 23 * * *")  # deployed: every night at 23:00
    try:
        await after.work()
        assert await after.trigger_due() == at("2026-11-24T23:00Z")
        clock.t = at("2026-11-24T23:00Z")
        await after.work()
        assert after.ran == ["2026-11-24T23:00:00Z"]
        clock.t = at("2026-11-25T02:00Z")  # the old trigger comes due, and ends
        await after.work()
        assert after.ran == ["2026-11-24T23:00:00Z"]
        assert await after.counts() == (1, 0)
        assert await after.trigger_due() == at("2026-11-25T23:00Z")
    finally:
        await after.app.aclose()


async def test_a_worker_lost_in_the_middle_of_a_trigger_s_run_loses_no_occurrence(
    job_url: str,
) -> None:
    """The worker dies once the trigger's run wrote its schedules, before its ack: the
    lease's end requeues the trigger at the next occurrence, and tonight's still runs."""
    clock = ManualClock(at("2026-11-24T10:00Z"))
    job = Job(job_url, clock)
    try:
        await job.work()
        clock.t = at("2026-11-25T02:00Z")
        backend = await job.app.backend()
        (claimed,) = (await backend.claim(["nightly"], worker="lost", limit=1, lease=60)).elements
        element = json.loads(claimed.payload)
        await job.task.run(Context(job.app, backend, claimed, element), element)
        clock.t += 61  # the lost worker's lease runs out
        await job.work()
        assert job.ran == ["2026-11-25T02:00:00Z"]
        assert await job.trigger_due() == at("2026-11-26T02:00Z")
        assert await backend.check() == []
    finally:
        await job.app.aclose()
