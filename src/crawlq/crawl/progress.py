"""The live progress line of `crawlq crawl`: pages, queued, rate, errors, throttled hosts."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import TextIO

from ..backends import Backend
from ..observe.logs import redact
from ..types import GroupStats
from .crawler import Crawl

MAX_THROTTLED_SHOWN = 3


@dataclass(frozen=True, kw_only=True, slots=True)
class Snapshot:
    pages: int
    errors: int
    queued: int
    running: int
    dead: int
    elapsed: float
    throttled: list[GroupStats]
    now: float

    @property
    def rate(self) -> float:
        return self.pages / self.elapsed if self.elapsed > 0 else 0.0


def render(snapshot: Snapshot) -> str:
    line = (
        f"{snapshot.pages} pages ({snapshot.rate:.1f}/s), {snapshot.queued} queued,"
        f" {snapshot.running} running, {snapshot.errors} errors, {snapshot.dead} dead"
    )
    if snapshot.throttled:
        shown = [
            f"{g.name} {max(0.0, (g.blocked_until or 0) - snapshot.now):.0f}s"
            f" ({redact(g.block_reason or '')})"
            for g in snapshot.throttled[:MAX_THROTTLED_SHOWN]
        ]
        more = len(snapshot.throttled) - MAX_THROTTLED_SHOWN
        line += "; throttled: " + ", ".join(shown) + (f" +{more} more" if more > 0 else "")
    return line


async def snapshot(crawl: Crawl, backend: Backend) -> Snapshot:
    queue = crawl.settings.queue
    stats = next((s for s in await backend.queue_stats([queue]) if s.name == queue), None)
    now = backend.now()
    groups = await backend.group_stats("*", limit=1000)
    throttled = sorted(
        (g for g in groups if g.blocked_until is not None and g.blocked_until > now),
        key=lambda g: g.blocked_until or 0,
    )
    return Snapshot(
        pages=crawl.stats.pages,
        errors=crawl.stats.errors,
        queued=(stats.total - stats.running) if stats else 0,
        running=stats.running if stats else 0,
        dead=stats.dead if stats else 0,
        elapsed=time.monotonic() - crawl.stats.started,
        throttled=throttled,
        now=now,
    )


async def show_progress(
    crawl: Crawl, stream: TextIO, *, interval: float = 0.5, live: bool = True
) -> None:
    """Redraws one line (a terminal) or prints a line each `interval` (a pipe or file);
    runs until cancelled."""
    backend = await crawl.app.backend()
    width = 0
    while True:
        await asyncio.sleep(interval)
        line = render(await snapshot(crawl, backend))
        if live:
            stream.write("\r" + line.ljust(width))
            width = len(line)
        else:
            stream.write(line + "\n")
        stream.flush()
