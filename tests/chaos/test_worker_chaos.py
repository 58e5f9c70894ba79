"""Worker chaos: late acknowledgements from a worker whose lease expired (the SIGSTOP case),
a stopped worker's task dropped once its lease ran out, then real `crawlq crawl` processes
SIGKILLed, replaced and SIGSTOPped mid-crawl, judged from the server's own request log.
The full-size run (10,000 pages, 20 kills) is `python -m benchmarks.chaos_bench`."""

from __future__ import annotations

import asyncio
import json
import os
import select
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import crawlq
from crawlq.backends import Backend
from crawlq.testing.chaos import (
    ChaosPlan,
    SyntheticWebThread,
    backend_problems,
    chaos_sites,
    run_worker_chaos,
)
from crawlq.types import ClaimResult, Failure
from crawlq.worker import Worker

from ..helpers import ManualClock, claim, schedule

ROOT = Path(__file__).resolve().parents[2]
APP = "tests.chaos.lease_app:app"

LEASE = 10.0


async def test_a_late_ack_after_the_attempts_started_afresh_is_refused(
    backend: Backend, clock: ManualClock
) -> None:
    """Run 1 stalls past its lease; run 2 is scheduled again while it runs, which starts the
    attempts afresh; run 3 (attempt 1 again) is running when run 1's ack arrives. That ack
    is stale: it must neither finish the element nor free run 3's group slot."""
    await schedule(backend, "pages", ["http://a.test/x"])
    (stalled,) = await claim(backend, lease=LEASE)
    clock.advance(LEASE + 1)
    (second,) = await claim(backend, lease=LEASE)
    assert second.attempt == stalled.attempt + 1
    await schedule(backend, "pages", ["http://a.test/x"])  # while it runs: deferred
    await backend.ack([second])
    clock.advance(1)
    (third,) = await claim(backend, lease=LEASE)
    assert third.attempt == stalled.attempt  # the attempts started afresh

    await backend.ack([stalled])  # the stalled worker wakes up
    await backend.fail([Failure(element=stalled, error="late", traceback="", retry_at=None)])

    info = await backend.element("pages", third.key)
    assert info is not None and info.state == "running"
    (group,) = await backend.group_stats("a.test")
    assert group.running == 1
    assert await backend.dead_letters("pages") == []
    await backend.ack([third])
    assert await backend.element("pages", third.key) is None


async def test_a_late_ack_never_finishes_a_new_element_in_a_reused_slot(
    backend: Backend, clock: ManualClock
) -> None:
    """The stalled run's element finishes elsewhere and a new element is added after it
    (SQLite may give it the same row id); the stalled run's ack must not finish it."""
    await schedule(backend, "pages", ["http://a.test/old"])
    (stalled,) = await claim(backend, lease=LEASE)
    clock.advance(LEASE + 1)
    (rerun,) = await claim(backend, lease=LEASE)
    await backend.ack([rerun])
    clock.advance(1)
    await schedule(backend, "pages", ["http://a.test/new"])
    (fresh,) = await claim(backend, lease=LEASE)
    await backend.ack([stalled])
    info = await backend.element("pages", fresh.key)
    assert info is not None and info.state == "running"
    await backend.ack([fresh])


async def test_a_late_ack_still_finishes_an_element_nobody_ran_again(
    backend: Backend, clock: ManualClock
) -> None:
    await schedule(backend, "pages", ["http://a.test/x"])
    (stalled,) = await claim(backend, lease=LEASE)
    clock.advance(LEASE + 1)
    await backend.ack([stalled])
    assert await backend.element("pages", stalled.key) is None
    assert await claim(backend) == []


def test_a_worker_stopped_past_its_lease_drops_the_task_before_it_goes_on(
    chaos_url: str, tmp_path: Path
) -> None:
    """The worker is SIGSTOPped while its task waits for an answer; the answer arrives while
    it is stopped and the lease runs out; SIGCONT. The task must not go on with the lease
    gone (a crawler would send a request on a slot that is no longer its own): the worker
    drops it, and the element runs again (attempt 2)."""
    lease = 2.0
    sock_path = str(tmp_path / "chaos.sock")
    record = tmp_path / "record.jsonl"
    env = {
        **os.environ,
        "CRAWLQ_BACKEND": chaos_url,
        "CHAOS_SOCKET": sock_path,
        "CHAOS_RECORD": str(record),
        "CHAOS_LEASE": str(lease),
        "PYTHONPATH": str(ROOT),
    }

    def did_work() -> bool:
        return record.exists() and bool(record.read_text())

    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as server:
        server.bind(sock_path)
        server.listen()
        server.settimeout(60)
        schedule_cli(env, "step", '"one"')
        worker = subprocess.Popen(
            [sys.executable, "-m", "crawlq", "worker", APP, "-c", "1"],
            cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        )  # fmt: skip
        try:
            first, _ = server.accept()
            with first:
                assert first.makefile().readline() == "1\n"
                worker.send_signal(signal.SIGSTOP)
                first.sendall(b"go\n")  # waits in the socket until the worker runs again
                time.sleep(lease + 1.5)  # the lease must run out: a span of time by definition
                worker.send_signal(signal.SIGCONT)
                # Either the stale task goes on (the defect) or the element comes back.
                wait_until(lambda: did_work() or readable(server), "the element to come back")
                assert not did_work(), "the task went on after its lease ran out"
                second, _ = server.accept()
                with second:
                    assert second.makefile().readline() == "2\n"
                    second.sendall(b"go\n")
                    wait_until(did_work, "the task's work")
        finally:
            worker.send_signal(signal.SIGCONT)
            worker.send_signal(signal.SIGTERM)
            output = worker.communicate(timeout=60)[0].decode()
    done = [json.loads(line) for line in record.read_text().splitlines()]
    assert done == [{"element": "one", "attempt": 2}], output
    assert "ran out" in output
    assert backend_problems(chaos_url) == []


@pytest.mark.timeout(300)  # its own limits (120 s) must fail first, with a diagnosis
def test_a_crawl_rides_out_killed_and_stopped_workers(chaos_url: str, tmp_path: Path) -> None:
    """1,000 pages on 20 sites, 3 `crawlq crawl` processes sharing the backend, one request
    at a time per site; 5 SIGKILLs (each followed by a replacement) and one SIGSTOP past the
    lease, at points set by the pages the server has seen."""
    plan = ChaosPlan(kills=5, stops=1, concurrency=1, lease=3.0, stop_for=5.0, timeout=120)
    with SyntheticWebThread(chaos_sites(20, 50, latency=0.03)) as web:
        result = run_worker_chaos(web, plan, chaos_url, tmp_path)
    verdict = result.verdict
    assert (result.kills, result.stops) == (5, 1)
    assert verdict.missing == []
    assert verdict.explain("concurrency") == []  # each with the requests involved
    # Only what the victims held ran twice; a stop that caught its worker inside a SQLite
    # write, or holding its writer turn, stalled every worker, and counts what they all held
    # (`result.stalls`).
    assert verdict.duplicates <= result.held
    assert result.problems == []  # check() passes, nothing left, no group slot held
    assert result.process_failures == []


@pytest.mark.timeout(300)  # its own limits (120 s) must fail first, with a diagnosis
def test_the_interval_holds_at_the_server_through_killed_and_stopped_workers(
    chaos_url: str, tmp_path: Path
) -> None:
    """600 pages on 20 sites at a 0.1 s interval per site, 3 processes, 3 SIGKILLs and one
    SIGSTOP past the lease. Each request confirms its reserved send time right before it
    is written (politeness.py), so no two arrivals at a site, stamped by the server's
    kernel, come closer than the interval. The bound of 1 leaves room for the one thing no
    check can close: the process preempted by the OS between its last look at the clock and
    the write (at full size, 0-1 in 10,000 requests on a loaded machine; before the slots,
    hundreds)."""
    plan = ChaosPlan(
        kills=3, stops=1, concurrency=1, delay=0.1, lease=3.0, stop_for=5.0, timeout=120
    )
    with SyntheticWebThread(chaos_sites(20, 30, latency=0.03)) as web:
        result = run_worker_chaos(web, plan, chaos_url, tmp_path)
    verdict = result.verdict
    assert verdict.missing == []
    assert verdict.explain("concurrency") == []
    assert verdict.count("interval") <= 1, verdict.explain("interval")
    assert result.problems == []
    assert result.process_failures == []


def schedule_cli(env: dict[str, str], queue: str, element: str) -> None:
    subprocess.run(
        [sys.executable, "-m", "crawlq", "schedule", queue, element, "--app", APP],
        cwd=ROOT, env=env, check=True, capture_output=True,
    )  # fmt: skip


def wait_until(condition: Callable[[], object], what: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.02)


def readable(sock: socket.socket) -> bool:
    return bool(select.select([sock], [], [], 0)[0])


async def test_a_claim_answered_after_its_lease_ran_out_is_not_started(
    chaos_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The worker is paused between sending a claim and reading its answer for longer than
    the lease: its tasks' first step would run before the lease timer, so they look for
    themselves and do not start. The element runs again, on attempt 2."""
    app = crawlq.App(chaos_url)
    runs: list[int] = []

    @app.task(group=None, lease=2.0)  # long enough that attempt 2 never runs out on a stall
    async def job(ctx: crawlq.Context, element: str) -> None:
        runs.append(ctx.attempt)

    await app.aschedule_many(job, ["one"])
    backend = await app.backend()
    real_claim = backend.claim
    paused = False

    async def paused_claim(*args: Any, **kwargs: Any) -> ClaimResult:
        nonlocal paused
        result = await real_claim(*args, **kwargs)
        if result.elements and not paused:
            paused = True
            await asyncio.sleep(2.5)  # the answer is read 2.5 s late: past the 2 s lease
        return result

    monkeypatch.setattr(backend, "claim", paused_claim)
    try:
        stats = await Worker(app, burst=True, burst_horizon=5.0).run()
    finally:
        await app.aclose()
    assert runs == [2]
    assert stats.lapsed == 1
