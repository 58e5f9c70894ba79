"""A reprocess killed on another machine (a shared Redis) refused the next one until the
backend forgot its worker (two minutes): the pid check only knows this machine's processes.
A reprocess now beats a registration of its own from a task of its own, and one whose last
beat is older than `dead_after` is dead wherever it ran. Real redis-server on loopback, real
SQLite results; "another machine" is a real `crawlq reprocess` process whose host name is
machine-b (all it writes says so), SIGKILLed where it chose to hold; the deciding side reads
a manual clock."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest

import crawlq
from crawlq.errors import ConfigError
from crawlq.pipeline import Pipeline, Record, StoredResponse
from crawlq.pipeline.registration import Heartbeat, busy
from crawlq.testing.redis_server import RedisServer

from .helpers import ManualClock
from .test_pipeline_processes import ROOT, URLS, Job

APP = "tests.apps.pipeline_app:app"
#: `python -m crawlq` as it runs on a machine named machine-b.
ON_MACHINE_B = (
    "import runpy, socket; socket.gethostname = lambda: 'machine-b';"
    " runpy.run_module('crawlq', run_name='__main__', alter_sys=True)"
)


class MachineB(Job):
    """`crawlq ARGS` run on machine-b (its data folder is the test's: one disk here)."""

    def start(self, *args: str, **env: str) -> subprocess.Popen[bytes]:
        return subprocess.Popen(
            [sys.executable, "-c", ON_MACHINE_B, *args],
            cwd=ROOT,
            env={**self.env, **env},
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )


def redis_url(server: RedisServer) -> str:
    return f"{server.url}?namespace=test-{uuid.uuid4().hex[:12]}"


def this_machines_pipeline(url: str, data: Path, clock: ManualClock) -> Pipeline:
    """The same stages as tests/apps/pipeline_app.py (its queues), parse's version 3."""
    pipeline = Pipeline(crawlq.App(url, clock=clock), data=data)

    @pipeline.fetch()
    async def download(ctx: crawlq.Context, url: str) -> None:
        return None

    @pipeline.stage()
    def parse(ctx: crawlq.SyncContext, stored: StoredResponse) -> list[Record]:
        lines = stored.body.decode().splitlines()
        return [
            Record(type="line", key=f"{stored.url}#{n}", data={"text": t, "version": "3"})
            for n, t in enumerate(lines)
        ]

    @pipeline.stage()
    def total(ctx: crawlq.SyncContext, lines: list[Record]) -> Record:
        versions = sorted({str(r.data["version"]) for r in lines})
        return Record(
            type="total", key=str(ctx.element), data={"lines": len(lines), "versions": [*versions]}
        )

    return pipeline


async def test_a_reprocess_killed_on_another_machine_stops_refusing_after_dead_after(
    tmp_path: Path, redis_server: RedisServer
) -> None:
    url = redis_url(redis_server)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CRAWLQ_", "PIPE_"))}
    env |= {"PYTHONPATH": str(ROOT), "CRAWLQ_BACKEND": url, "PIPE_DATA": str(tmp_path / "data")}
    here = Job(data=tmp_path / "data", env=env)
    here.ok("schedule", "--app", APP, "--text", "download", *URLS)
    here.ok("worker", APP, "--burst")
    machine_b = MachineB(data=here.data, env=env)
    machine_b.killed_when_held("reprocess", APP, "parse", hold=f"parse:{URLS[2]}")

    clock = ManualClock(time.time())
    pipeline = this_machines_pipeline(url, here.data, clock)
    try:
        backend = await pipeline.app.backend()
        left = [w for w in await backend.workers() if w.host == "machine-b"]
        # what machine-b's reprocess left: its registration, and its worker's row
        assert sorted(w.id.split(":")[:2] for w in left) == [["reprocess", "machine-b"]] * 2
        (registration,) = [w for w in left if not w.id.endswith("/worker")]
        dead_after = pipeline.heartbeat.dead_after
        assert dead_after == 30
        clock.t = registration.heartbeat + dead_after - 0.001  # as old as a live one may be
        with pytest.raises(ConfigError) as refused:
            await pipeline.reprocess("parse")
        said = str(refused.value)
        assert f"reprocess pid {registration.pid} on machine-b" in said, said
        assert "last heartbeat 30s ago: if it was killed, it counts no more in 0s" in said, said
        assert "counts no more 30s after its last heartbeat; --force runs at once" in said, said
        clock.advance(0.5)
        result = await pipeline.reprocess("parse")
    finally:
        await pipeline.app.aclose()
        pipeline.results.close()
    assert result.scheduled == len(URLS) and result.finished, result
    assert {r["version"] for r in here.rows("line")} == {"3"}
    assert [(r["lines"], r["versions"]) for r in here.rows("total")] == [(3, ["3"])] * len(URLS)


def _held_pipeline(
    url: str, data: Path, clock: ManualClock
) -> tuple[Pipeline, threading.Event, threading.Event]:
    """download -> source -> parse, parse holding on its one input until released; and the
    events: parse entered, parse released."""
    pipeline = Pipeline(
        crawlq.App(url, clock=clock), data=data, heartbeat=Heartbeat(every=0.01, dead_after=30)
    )
    release = threading.Event()
    entered = threading.Event()

    @pipeline.fetch()
    async def download(ctx: crawlq.Context, url: str) -> None:
        return None

    @pipeline.stage()
    def source(ctx: crawlq.SyncContext, stored: StoredResponse) -> list[Record]:
        return []

    @pipeline.stage()
    def parse(ctx: crawlq.SyncContext, given: list[Record]) -> list[Record]:
        entered.set()
        assert release.wait(60)
        return []

    pipeline.results.replace("source", "page", [Record(type="src", key="page")])
    return pipeline, entered, release


async def until(condition: Callable[[], bool], what: str) -> None:
    """Waits for `condition` (checked every 10 ms, 30 s at most): a condition, not a time."""
    for _ in range(3000):
        if condition():
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"timed out waiting for {what}")


async def test_a_live_reprocess_beats_while_a_stage_runs_so_it_never_looks_dead(
    tmp_path: Path, redis_server: RedisServer
) -> None:
    """Seen from machine-c, a reprocess stuck in one input for longer than dead_after (the
    clock moved 1,000 s while it was) is still alive: its beats do not wait for the input."""
    url = redis_url(redis_server)
    clock = ManualClock(time.time())
    pipeline, entered, release = _held_pipeline(url, tmp_path / "data", clock)
    backend = await pipeline.app.backend()
    running = asyncio.create_task(pipeline.reprocess("parse"))
    try:
        await until(lambda: entered.is_set() or running.done(), "parse to start")
        assert not running.done()
        clock.advance(1000)

        async def beats() -> list[float]:  # its registration's (its worker's are lease/3 apart)
            rows = await backend.workers()
            return [w.heartbeat for w in rows if w.id.startswith("reprocess:") and "/" not in w.id]

        for _ in range(3000):
            if clock() in await beats():
                break
            await asyncio.sleep(0.01)
        assert clock() in await beats(), "no beat while parse held its input"
        assert not running.done() and not release.is_set()
        found = await busy(backend, ["parse"], heartbeat=pipeline.heartbeat, here="machine-c")
        assert len(found) == 1, found
        assert found[0].startswith(f"reprocess pid {os.getpid()} on "), found
        assert "last heartbeat 0s ago" in found[0], found
        release.set()
        result = await running
        assert result.finished
        assert [w for w in await backend.workers() if w.id.startswith("reprocess:")] == []
    finally:
        release.set()
        running.cancel()
        await asyncio.gather(running, return_exceptions=True)
        await pipeline.app.aclose()
        pipeline.results.close()


@pytest.mark.parametrize(("every", "dead_after"), [(0, 30), (-1, 30), (11, 30)])
def test_a_heartbeat_beats_at_least_three_times_within_dead_after(
    every: float, dead_after: float
) -> None:
    with pytest.raises(ConfigError, match="at least three times within dead_after"):
        Heartbeat(every=every, dead_after=dead_after)
