"""`crawlq stats --watch`: the numbers of `crawlq stats`, redrawn in place with rich. Text
others chose goes through `printable` (observe/logs.py), as every command shows it."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ..backends import Backend
from ..types import GroupStats, QueueStats, WorkerInfo
from .logs import printable, redact
from .metrics import throttle_reason

if TYPE_CHECKING:  # rich is imported when drawing, not by every command that imports this
    from rich.console import Console, Group
    from rich.text import Text


def _cell(text: str, style: str = "") -> Text:
    """A table cell of text others chose: shown as it is, never read as rich markup (a group
    named ``x[/]y`` would not parse, ``[red]x`` would be styled), controls escaped."""
    from rich.text import Text

    return Text(printable(text, one_line=True), style=style)


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
    from rich.console import Group
    from rich.table import Table
    from rich.text import Text

    title = _cell(f"queues · {redact(url)}", "table.title")
    table = Table(title=title, title_justify="left", expand=False)
    for name in ("queue", "total", "due", "delayed", "running", "dead", "net change"):
        table.add_column(name, justify="left" if name == "queue" else "right")
    for q in queues:
        table.add_row(
            _cell(q.name),
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
            if reason == "blocked":  # masked as `crawlq stats` masks it
                why = f"blocked {_in(g.blocked_until, now)}: {redact(g.block_reason or '')}"
                why = why.strip()
            elif reason is not None:
                why = reason
            busy.add_row(
                _cell(g.name or "(none)"),
                f"{g.queued:,}",
                f"{g.running:,}",
                f"{concurrency} at once, {g.limit.interval:g}s apart",
                _in(g.next_start, now),
                _cell(why, "yellow" if reason else ""),
            )
        parts.append(busy)
    if workers:
        live = Table(title="workers", title_justify="left")
        for name in ("worker", "host", "pid", "running", "heartbeat"):
            live.add_column(name, justify="right" if name in ("pid", "running") else "left")
        for w in workers:
            live.add_row(
                _cell(w.id),
                _cell(w.host),
                str(w.pid),
                str(w.running),
                f"{now - w.heartbeat:.0f}s ago",
            )
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
    from rich.console import Console
    from rich.live import Live

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
