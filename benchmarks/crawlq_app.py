"""The tasks crawlq's benchmarks run: the same no-op and I/O work as the peers' tasks."""

from __future__ import annotations

import asyncio
import os

import crawlq
from benchmarks.common import mark_done, mark_late

app = crawlq.App(os.environ.get("CRAWLQ_BACKEND"))


@app.task(group=None)
async def noop(ctx: crawlq.Context, n: int) -> None:
    mark_done()


@app.task(group=None)
async def io(ctx: crawlq.Context, n: int) -> None:
    await asyncio.sleep(0.05)
    mark_done()


@app.task(group=None)
async def late(ctx: crawlq.Context, element: dict[str, float]) -> None:
    """A delayed element: records how late it started (`element["due"]` is wall-clock)."""
    mark_late(element["due"])
