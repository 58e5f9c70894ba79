"""Looking inside and steering a backend: `stats`, `dead`, `limits`."""

from __future__ import annotations

import contextlib
import dataclasses
import glob
import time
from collections.abc import Sequence
from typing import Any

import click

from .. import checks
from ..app import App, limit_of
from ..backends import Backend
from ..errors import ConfigError, CrawlqError
from ..grouping import group_name
from ..identity import canonical_json, parse_json
from ..limits import check_pattern
from ..observe.logs import printable, redact
from ..types import GroupStats, Limit, LimitRule, QueueStats, WorkerInfo
from .common import Group, app_option, backend_option, connected, echo_json, resolve_url, run

#: The most rows --limit and --groups ask for, and the highest --offset: SQLite and Redis
#: take 64-bit integers (larger ones ended in an OverflowError), offset + limit included.
MAX_ROWS = 10**9
MAX_OFFSET = 2**62


def _table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """Left-aligned first column, the others right-aligned; each cell on one line, its
    control characters escaped (names and reasons come from crawled sites)."""
    cells = [
        [str(c) for c in headers],
        *[[printable(str(c), one_line=True) for c in row] for row in rows],
    ]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    return "\n".join(
        "  ".join(
            c.ljust(w) if i == 0 else c.rjust(w)
            for i, (c, w) in enumerate(zip(row, widths, strict=False))
        )
        for row in cells
    )


def _when(moment: float | None, now: float) -> str:
    if moment is None or moment <= now:
        return "-"
    return f"in {moment - now:.1f}s"


def _limit_text(limit: Limit) -> str:
    concurrency = "unlimited" if limit.concurrency is None else str(limit.concurrency)
    return f"{concurrency} at once, {limit.interval:g}s apart"


@click.command()
@click.option(
    "--json",
    "as_json",
    is_flag=True,
    help="Print JSON, as the dashboard's /api/stats: a block with no end is"
    " blocked_for_good, its blocked_until null.",
)
@click.option(
    "--groups",
    "group_count",
    type=click.IntRange(min=0, max=MAX_ROWS),
    default=10,
    show_default=True,
    help="Busiest groups shown.",
)
@click.option("--watch", is_flag=True, help="Redraw live until Ctrl-C.")
@click.option(
    "--interval", default=1.0, show_default=True, help="Seconds between redraws with --watch."
)
@click.option(
    "--count",
    type=click.IntRange(min=1),
    default=None,
    help="With --watch: stop after this many redraws.",
)
@app_option
@backend_option
def stats(
    as_json: bool,
    group_count: int,
    watch: bool,
    interval: float,
    count: int | None,
    app_spec: str | None,
    backend_url: str | None,
) -> None:
    """Queues, their busiest groups, and live workers (--watch: live)."""
    _, url = resolve_url(app_spec, backend_url)
    if watch:
        if as_json:
            raise click.UsageError("--watch and --json exclude each other")
        if checks.seconds(interval, "--interval") <= 0:
            raise ConfigError(f"--interval must be positive, got {interval:g}")
        _watch(url, group_count, interval, count)
        return

    async def main() -> tuple[list[QueueStats], list[GroupStats], list[WorkerInfo], float]:
        async with connected(url) as backend:
            return (
                await backend.queue_stats(),
                await backend.group_stats(limit=group_count),
                await backend.workers(),
                backend.now(),
            )

    queues, groups, workers, now = run(main)
    if as_json:
        from ..observe.dashboard import stats_json  # the dashboard's /api/stats writes it too

        click.echo(stats_json(queues, groups, workers, now, indent=2))
        return
    click.echo(
        _table(
            ["queue", "total", "due", "delayed", "running", "dead"],
            [[q.name, q.total, q.due, q.delayed, q.running, q.dead] for q in queues],
        )
        if queues
        else "no queues"
    )
    if groups:
        click.echo()
        click.echo(
            _table(
                ["group", "queued", "running", "limit", "next start", "blocked"],
                [
                    [
                        g.name or "(none)",
                        g.queued,
                        g.running,
                        _limit_text(g.limit),
                        _when(g.next_start, now),
                        f"{_when(g.blocked_until, now)} {redact(g.block_reason or '')}".strip()
                        if g.blocked_until and g.blocked_until > now
                        else "-",
                    ]
                    for g in groups
                ],
            )
        )
    click.echo()
    click.echo(
        _table(
            ["worker", "pid", "running", "heartbeat"],
            [[w.id, w.pid, w.running, f"{now - w.heartbeat:.0f}s ago"] for w in workers],
        )
        if workers
        else "no live workers"
    )


def _watch(url: str, group_count: int, interval: float, count: int | None) -> None:
    from ..observe.terminal import watch

    async def main() -> None:
        async with connected(url) as backend:
            await watch(backend, groups=group_count, interval=interval, iterations=count)

    with contextlib.suppress(KeyboardInterrupt):
        run(main)


@click.group(cls=Group, short_help="List, re-queue or purge elements that failed every attempt.")
def dead() -> None:
    """Elements that failed every attempt: list, re-queue or purge them."""


@dead.command("list", short_help="Dead elements of QUEUE, newest first.")
@click.argument("queue")
@click.option(
    "--limit",
    type=click.IntRange(min=0, max=MAX_ROWS),
    default=20,
    show_default=True,
    help="Dead elements shown at most.",
)
@click.option(
    "--offset",
    type=click.IntRange(min=0, max=MAX_OFFSET),
    default=0,
    show_default=True,
    help="Newest dead elements skipped first (to page through them).",
)
@click.option("--json", "as_json", is_flag=True, help="Print JSON, tracebacks included.")
@backend_option
@app_option
def dead_list(
    queue: str,
    limit: int,
    offset: int,
    as_json: bool,
    backend_url: str | None,
    app_spec: str | None,
) -> None:
    """Dead elements of QUEUE, newest first (credentials masked; --json: keys and payloads
    exact, as requeue needs them)."""
    _, url = resolve_url(app_spec, backend_url)
    queue = checks.name(queue, "queue name")

    async def main() -> list[Any]:
        async with connected(url) as backend:
            return await backend.dead_letters(queue, limit=limit, offset=offset)

    letters = run(main)
    if as_json:
        echo_json([dataclasses.asdict(d) for d in letters])
        return
    if not letters:
        click.echo(f"no dead elements in {queue}")
    for d in letters:
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(d.died_at))
        payload = printable(redact(d.payload), one_line=True)
        # Each line of the error indented: none can pass for the start of another letter.
        error = printable(redact(d.error)).replace("\n", "\n    ")
        click.echo(f"{when}  attempts={d.attempts}  {payload}\n    {error}")


def _canonical_key(key: str, text: bool) -> str:
    """A key as stored: with `text`, the key of the text element `key` (its JSON); JSON keys
    in canonical form whatever their spelling; others (keys of a task's key function) as
    given."""
    if text:
        return canonical_json(key)
    try:
        return canonical_json(parse_json(key))
    except CrawlqError:
        return key


def _take(
    queue: str, keys: tuple[str, ...], all_: bool, text: bool, url: str, requeue: bool
) -> int:
    """Re-queues or purges the dead elements named (every one with `all_`); how many. When
    some KEYs are no dead element of the queue, a ConfigError says how many were taken and
    names the others."""
    if not keys and not all_:
        raise click.UsageError("name the KEYs (canonical JSON, as `dead list` shows) or pass --all")
    queue = checks.name(queue, "queue name")
    chosen = list(dict.fromkeys(_canonical_key(key, text) for key in keys))

    async def main() -> tuple[int, list[str]]:
        async with connected(url) as backend:
            take = backend.requeue_dead if requeue else backend.purge_dead
            if all_:
                return await take(queue, None), []
            dead = [await _is_dead(backend, queue, key) for key in chosen]
            found = [key for key, is_dead in zip(chosen, dead, strict=True) if is_dead]
            missing = [key for key, is_dead in zip(chosen, dead, strict=True) if not is_dead]
            return (await take(queue, found) if found else 0), missing

    done, missing = run(main)
    if not all_ and done < len(chosen):
        verb = "requeued" if requeue else "purged"  # the one Error line says how many
        raise ConfigError(_not_dead(queue, done, len(chosen), verb, missing, text))
    return done


async def _is_dead(backend: Backend, queue: str, key: str) -> bool:
    found = await backend.element(queue, key)
    return found is not None and found.dead is not None


def _not_dead(queue: str, done: int, named: int, verb: str, missing: list[str], text: bool) -> str:
    """Which KEYs were no dead element of `queue`, and how to name a text element."""
    if not missing:  # dead when looked up, taken by someone else since
        return f"{verb} {done} of the {named} elements named: the others left the dead letters"
    shown = ", ".join(checks.shorten(redact(key)) for key in missing[:5])
    more = f" and {len(missing) - 5} more" if len(missing) > 5 else ""
    hint = ""
    if not text and any(_is_plain_text(key) for key in missing):
        hint = (
            " (a key is JSON, as `dead list` shows: a URL with its quotes, '\"https://...\"';"
            " or pass --text to name text elements such as URLs as they are)"
        )
    return f"{verb} {done} of the {named} elements named; not dead in {queue}: {shown}{more}{hint}"


def _is_plain_text(key: str) -> bool:
    try:
        parse_json(key)
    except CrawlqError:
        return True
    return False


_text_option = click.option(
    "--text",
    is_flag=True,
    help="KEYs are plain strings (URLs), the elements as `schedule --text` takes them.",
)


@dead.command("requeue")
@click.argument("queue")
@click.argument("keys", nargs=-1)
@click.option("--all", "all_", is_flag=True, help="Every dead element of QUEUE.")
@_text_option
@backend_option
@app_option
def dead_requeue(
    queue: str,
    keys: tuple[str, ...],
    all_: bool,
    text: bool,
    backend_url: str | None,
    app_spec: str | None,
) -> None:
    """Queue dead elements again, due now, with fresh attempts. Exits 1, naming them, when
    some KEYs are no dead element of QUEUE."""
    _, url = resolve_url(app_spec, backend_url)
    click.echo(f"requeued {_take(queue, keys, all_, text, url, True)}")


@dead.command("purge")
@click.argument("queue")
@click.argument("keys", nargs=-1)
@click.option("--all", "all_", is_flag=True, help="Every dead element of QUEUE.")
@_text_option
@backend_option
@app_option
def dead_purge(
    queue: str,
    keys: tuple[str, ...],
    all_: bool,
    text: bool,
    backend_url: str | None,
    app_spec: str | None,
) -> None:
    """Delete dead elements for good. Exits 1, naming them, when some KEYs are no dead
    element of QUEUE."""
    _, url = resolve_url(app_spec, backend_url)
    click.echo(f"purged {_take(queue, keys, all_, text, url, False)}")


@click.group(
    cls=Group,
    invoke_without_command=True,
    short_help="Per-group politeness rules and blocks; changes apply at once.",
)
@backend_option
@app_option
@click.pass_context
def limits(ctx: click.Context, backend_url: str | None, app_spec: str | None) -> None:
    """Per-group politeness rules (glob patterns); changes apply to running workers at once."""
    ctx.obj = (app_spec, backend_url)
    if ctx.invoked_subcommand is None:
        ctx.invoke(limits_list)


def _limits_target(
    ctx: click.Context, app_spec: str | None, backend_url: str | None
) -> tuple[App | None, str]:
    """The app (if named) and the backend URL: --backend/--app given after the subcommand
    win over those given before it, and any given option wins over CRAWLQ_BACKEND."""
    outer_app, outer_backend = ctx.obj or (None, None)
    outer = ctx.parent.get_parameter_source("backend_url") if ctx.parent else None
    inner = ctx.get_parameter_source("backend_url")
    env = click.core.ParameterSource.ENVIRONMENT
    if inner is env and outer is not env and outer_backend:
        backend_url = None
    return resolve_url(app_spec or outer_app, backend_url or outer_backend)


@limits.command("list", short_help="The rules, then the robots.txt Crawl-delays.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@backend_option
@app_option
@click.pass_context
def limits_list(
    ctx: click.Context,
    as_json: bool = False,
    backend_url: str | None = None,
    app_spec: str | None = None,
) -> None:
    """The rules, most general first, then the Crawl-delays crawls read in robots.txt: each a
    floor under its host's interval, whatever rule gives the host its limit."""
    _, url = _limits_target(ctx, app_spec, backend_url)

    async def main() -> tuple[list[LimitRule], dict[str, float]]:
        async with connected(url) as backend:
            return await backend.limits(), await backend.crawl_delays()

    rules, crawl_delays = run(main)
    if as_json:
        echo_json({"rules": [dataclasses.asdict(r) for r in rules], "crawl_delays": crawl_delays})
        return
    rows: list[list[Any]] = [
        [r.pattern, r.limit.concurrency or "unlimited", f"{r.limit.interval:g}s", r.origin]
        for r in rules
    ]
    rows += [
        [name, "by rule", f"at least {s:g}s", "robots.txt"] for name, s in crawl_delays.items()
    ]
    click.echo(_table(["pattern", "concurrency", "interval", "set by"], rows))


@limits.command("set")
@click.argument("pattern")
@click.option(
    "--concurrency", type=int, default=None, help="In flight at once (default unlimited)."
)
@click.option(
    "--interval", type=float, default=0.0, show_default=True, help="Seconds between starts."
)
@backend_option
@app_option
@click.pass_context
def limits_set(
    ctx: click.Context,
    pattern: str,
    concurrency: int | None,
    interval: float,
    backend_url: str | None,
    app_spec: str | None,
) -> None:
    """Add or replace the rule for PATTERN, such as '*.example.com'. It outlasts the app's
    rule for PATTERN, which workers store when they start, until it is deleted."""
    _, url = _limits_target(ctx, app_spec, backend_url)
    limit = limit_of(pattern, concurrency, interval)
    pattern = check_pattern(checks.name(pattern, "limit pattern"))
    rule = LimitRule(pattern=pattern, limit=limit, origin="operator")

    async def main() -> None:
        async with connected(url) as backend:
            await backend.set_limits([rule])

    run(main)
    click.echo(f"{rule.pattern}: {_limit_text(rule.limit)}")


@limits.command("delete", short_help="Remove the rule for PATTERN (and a host's Crawl-delay).")
@click.argument("pattern")
@backend_option
@app_option
@click.pass_context
def limits_delete(
    ctx: click.Context, pattern: str, backend_url: str | None, app_spec: str | None
) -> None:
    """Remove the rule for PATTERN, and the robots.txt Crawl-delay of a host so named (a crawl
    sets it again when it next reads that robots.txt). With the app named (--app), its own
    rule for PATTERN, if it has one, takes the place at once; otherwise when a worker of it
    next starts."""
    app, url = _limits_target(ctx, app_spec, backend_url)
    typed = checks.name(pattern, "limit pattern")
    # Rules stored before patterns were spelled as group names (IDNA, no trailing dot) kept
    # their own spelling: found by it when not by the new one.
    spellings = list(dict.fromkeys([check_pattern(typed), typed.lower()]))

    async def main() -> tuple[str, LimitRule | None] | None:
        async with connected(url) as backend:
            for spelling in spellings:
                if await backend.delete_limit(spelling):
                    own = app.limit_rules.get(spelling) if app else None
                    if own is not None:
                        await backend.set_limits([own])
                    return spelling, own
            return None

    done = run(main)
    if done is None:
        raise ConfigError(f"no limit rule or Crawl-delay {spellings[0]!r}")
    deleted, own = done
    back = f"; the app's rule is back: {_limit_text(own.limit)}" if own else ""
    click.echo(f"deleted {deleted}{back}")


def _group(typed: str) -> str:
    """A group typed by hand, in the spelling of group names (lower case, IDNA, no trailing
    dot), as the groups of elements are made."""
    return group_name(checks.name(typed, "group"))


async def _warn_if_idle(backend: Backend, group: str, typed: str) -> None:
    """Says on stderr when no queued or running element is in `group`: most often a group
    typed other than crawlq names it (a host with a port or a path, a custom name)."""
    if await backend.group_stats(glob.escape(group), limit=1):
        return
    spelled = f" (as crawlq spells {typed!r})" if group != typed else ""
    click.echo(
        f"Warning: no queued or running element is in group {group!r}{spelled}",
        err=True,
    )


@limits.command("block")
@click.argument("group")
@click.option("--for", "seconds", type=float, required=True, help="Seconds from now.")
@click.option(
    "--reason",
    default="blocked by hand",
    show_default=True,
    help="Why, shown by crawlq stats and the dashboard.",
)
@backend_option
@app_option
@click.pass_context
def limits_block(
    ctx: click.Context,
    group: str,
    seconds: float,
    reason: str,
    backend_url: str | None,
    app_spec: str | None,
) -> None:
    """Start nothing of GROUP (a host, such as example.com) for a while. Warns when no
    queued or running element is in GROUP, and blocks it all the same."""
    _, url = _limits_target(ctx, app_spec, backend_url)
    typed, group = group, _group(group)
    seconds = checks.seconds(seconds, "--for")

    async def main() -> None:
        async with connected(url) as backend:
            await backend.block_group(group, backend.now() + seconds, reason)
            await _warn_if_idle(backend, group, typed)

    run(main)
    click.echo(f"{group} blocked for {seconds:g}s")


@limits.command("unblock")
@click.argument("group")
@backend_option
@app_option
@click.pass_context
def limits_unblock(
    ctx: click.Context, group: str, backend_url: str | None, app_spec: str | None
) -> None:
    """Lift a block on GROUP. Warns when no queued or running element is in GROUP."""
    _, url = _limits_target(ctx, app_spec, backend_url)
    typed, group = group, _group(group)

    async def main() -> None:
        async with connected(url) as backend:
            await backend.block_group(group, None, None)
            await _warn_if_idle(backend, group, typed)

    run(main)
    click.echo(f"{group} unblocked")


@click.command(short_help="Verify the queue store's invariants (exit 1 if one is broken).")
@app_option
@backend_option
def check(app_spec: str | None, backend_url: str | None) -> None:
    """Verify every internal invariant of the queue store; exit 1 if one is broken.

    Reads the whole store: run it with the workers stopped."""
    _, url = resolve_url(app_spec, backend_url)

    async def go() -> list[str]:
        async with connected(url) as backend:
            return await backend.check()

    problems = run(go)
    for problem in problems:
        click.echo(printable(problem))
    if problems:
        raise SystemExit(1)
    click.echo(f"{redact(url)}: consistent")
