"""`crawlq stats --watch`: the numbers of `crawlq stats`, redrawn in place with rich."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from rich.console import Console, Group
from rich.live import Live
from rich.table import Table
from rich.text import Text

from ..backends import Backend
from ..types import GroupStats, QueueStats, WorkerInfo
from .logs import redact
from .metrics import throttle_reason


def _in(moment: float | None, now: float) -> str:
    return "-" if moment is None or moment <= now else f"in {moment - now:.1f}s"


def _rate(before: QueueStats | None, after: QueueStats, seconds: float) -> str:
    if before is None or seconds <= 0:
        return "-"
    return f"{(after.total - before.total) / seconds:+.1f}/s"


def render(
    url: str,
    queues: list[QueueStats],
    groups: list[GroupStats],
    workers: list[WorkerInfo],
    now: float,
    previous: dict[str, QueueStats],
    seconds: float,
) -> Group:
    table = Table(title=f"queues · {redact(url)}", title_justify="left", expand=False)
    for name in ("queue", "total", "due", "delayed", "running", "dead", "net change"):
        table.add_column(name, justify="left" if name == "queue" else "right")
    for q in queues:
        table.add_row(
            q.name,
            f"{q.total:,}",
            f"{q.due:,}",
            f"{q.delayed:,}",
            f"{q.running:,}",
            Text(f"{q.dead:,}", style="red" if q.dead else ""),
            _rate(previous.get(q.name), q, seconds),
        )
    parts: list[Any] = [table if queues else Text("no queues")]
    if groups:
        busy = Table(title="busiest groups", title_justify="left")
        for name in ("group", "queued", "running", "limit", "next start", "why"):
            busy.add_column(name, justify="right" if name in ("queued", "running") else "left")
        for g in groups:
            concurrency = "unlimited" if g.limit.concurrency is None else str(g.limit.concurrency)
            reason = throttle_reason(g, now)
            why = "-"
            if reason == "blocked":
                why = f"blocked {_in(g.blocked_until, now)}: {g.block_reason or ''}".strip()
            elif reason is not None:
                why = reason
            busy.add_row(
                g.name or "(none)",
                f"{g.queued:,}",
                f"{g.running:,}",
                f"{concurrency} at once, {g.limit.interval:g}s apart",
                _in(g.next_start, now),
                Text(why, style="yellow" if reason else ""),
            )
        parts.append(busy)
    if workers:
        live = Table(title="workers", title_justify="left")
        for name in ("worker", "host", "pid", "running", "heartbeat"):
            live.add_column(name, justify="right" if name in ("pid", "running") else "left")
        for w in workers:
            live.add_row(w.id, w.host, str(w.pid), str(w.running), f"{now - w.heartbeat:.0f}s ago")
        parts.append(live)
    else:
        parts.append(Text("no live workers"))
    return Group(*parts)


async def watch(
    backend: Backend,
    *,
    groups: int,
    interval: float,
    iterations: int | None = None,
    console: Console | None = None,
    stop: Callable[[], bool] = lambda: False,
) -> None:
    """Redraws the stats every `interval` seconds, `iterations` times or until stopped."""
    previous: dict[str, QueueStats] = {}
    last_at = 0.0
    done = 0
    with Live(console=console or Console(), auto_refresh=False, transient=False) as live:
        while not stop() and (iterations is None or done < iterations):
            queues = await backend.queue_stats()
            found = await backend.group_stats(limit=groups)
            workers = await backend.workers()
            now = backend.now()
            view = render(backend.url, queues, found, workers, now, previous, now - last_at)
            live.update(view, refresh=True)
            previous, last_at = {q.name: q for q in queues}, now
            done += 1
            if iterations is None or done < iterations:
                await asyncio.sleep(interval)
