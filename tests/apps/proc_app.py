"""The app that worker-process tests run with `crawlq worker tests.apps.proc_app:app`.

Settings come from environment variables set by the tests; every task appends one JSON line
per event to the file named by CRAWLQ_RECORD (O_APPEND writes of one line are atomic).
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from pathlib import Path
from typing import Any

import crawlq

from .record import peak_overlap, read_events

app = crawlq.App(os.environ["CRAWLQ_BACKEND"])
LEASE = float(os.environ.get("TEST_LEASE", "60"))
_interval = float(os.environ.get("TEST_INTERVAL", "0"))
_concurrency = os.environ.get("TEST_CONCURRENCY")
app.limit(
    "polite.test",
    concurrency=int(_concurrency) if _concurrency else None,
    interval=_interval,
)
_record_path = Path(os.environ["CRAWLQ_RECORD"])
_record = os.open(_record_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT)


def record(event: str, ctx: crawlq.Context, element: Any) -> None:
    line = {
        "event": event,
        "element": element,
        "pid": os.getpid(),
        "t": time.time(),
        "claimed_at": ctx.claimed_at,
        "attempt": ctx.attempt,
    }
    os.write(_record, (json.dumps(line) + "\n").encode())


_crowd = int(os.environ.get("TEST_CROWD", "0"))
_crowd_met = False


async def _wait_for_crowd(ctx: crawlq.Context, url: str) -> None:
    """With TEST_CROWD=N, a hit waits until N hits were in flight at once, so a test on a
    loaded machine still sees whether the group's limit lets N through. After 30 s it gives
    up, once for the whole process, and says so in the record ("crowd-timeout")."""
    global _crowd_met
    deadline = time.monotonic() + 30
    while not _crowd_met:
        if peak_overlap(read_events(_record_path)) >= _crowd:
            _crowd_met = True
        elif time.monotonic() > deadline:
            _crowd_met = True
            record("crowd-timeout", ctx, url)
        else:
            await asyncio.sleep(0.005)


@app.task(lease=LEASE)
async def hit(ctx: crawlq.Context, url: str) -> None:
    """A request to a polite host: takes a little while."""
    record("start", ctx, url)
    if _crowd:
        await _wait_for_crowd(ctx, url)
    await asyncio.sleep(float(os.environ.get("TEST_HIT_SECONDS", "0.02")))
    record("end", ctx, url)


@app.task(group=None, lease=LEASE)
async def hold(ctx: crawlq.Context, element: dict[str, Any]) -> None:
    """Sleeps `seconds` (held forever with -1) on the attempts listed in `on`, else returns."""
    record("start", ctx, element)
    if ctx.attempt in element.get("on", [1]):
        seconds = element.get("seconds", -1)
        await asyncio.sleep(3600 if seconds < 0 else seconds)
    record("end", ctx, element)
