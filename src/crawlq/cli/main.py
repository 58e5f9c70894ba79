"""`crawlq`: run workers, schedule work, and look inside queues."""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path
from typing import Any, BinaryIO

import click

from .. import writelock
from ..app import App
from ..checks import seconds
from ..errors import ConfigError
from ..identity import parse_json
from ..observe.logs import configure as configure_logging
from ..types import JSON, ScheduleResult
from ..worker import DEFAULT_CONCURRENCY, Worker, collect_less_often, supervise
from ..worker.supervisor import end_with_parent
from .common import (
    Group,
    app_option,
    backend_option,
    connected,
    load_app,
    log_level_option,
    resolve_url,
    run,
    setup_logging,
)
from .crawl import crawl
from .dashboard import dashboard
from .inspect import check, dead, limits, stats
from .pipeline import export, reprocess
from .warc import warc


@click.group(cls=Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="crawlq")
def cli() -> None:
    """crawlq: a durable, polite queue for crawling, scraping and ETL jobs."""
    writelock.stop_between_writes()
    collect_less_often()


@cli.command(short_help="Run the tasks of MODULE:APP, until stopped (or done: --burst).")
@click.argument("app_spec", metavar="MODULE:APP")
@click.option("-q", "--queue", "queues", multiple=True, help="Run only these queues (repeatable).")
@click.option(
    "-c",
    "--concurrency",
    type=click.IntRange(min=1),
    default=DEFAULT_CONCURRENCY,
    show_default=True,
    help="Tasks run at once by each process.",
)
@click.option(
    "-p",
    "--processes",
    type=click.IntRange(min=1),
    default=1,
    show_default=True,
    help="Worker processes.",
)
@click.option("--burst", is_flag=True, help="Exit once nothing is left to run.")
@click.option(
    "--grace",
    default=30.0,
    show_default=True,
    help="Seconds running tasks get to finish on SIGTERM/SIGINT.",
)
@log_level_option
def worker(
    app_spec: str,
    queues: tuple[str, ...],
    concurrency: int,
    processes: int,
    burst: bool,
    grace: float,
    log_level: str,
) -> None:
    """Run the tasks of MODULE:APP until stopped (or until done, with --burst)."""
    setup_logging(log_level)
    grace = seconds(grace, "--grace")
    if processes > 1 and "CRAWLQ_CHILD" not in os.environ:
        load_app(app_spec)  # fail here, once, rather than in every child
        child_args = [app_spec, "-c", str(concurrency), "--grace", str(grace)]
        child_args += ["--log-level", log_level, *(f"--queue={q}" for q in queues)]
        if burst:
            child_args.append("--burst")
        sys.exit(supervise(child_args, processes, restart=not burst))
    app = load_app(app_spec)

    async def main() -> None:
        runner = Worker(
            app, queues=list(queues) or None, concurrency=concurrency, burst=burst, grace=grace
        )
        runner.install_signal_handlers()
        end_with_parent()
        try:
            result = await runner.run()
        finally:
            await app.aclose()
        if burst:
            click.echo(
                f"done {result.done}, failed {result.failed} (dead {result.dead}),"
                f" returned {result.released}",
                err=True,
            )

    run(main)


def _read_lines(file: BinaryIO) -> list[str]:
    """The non-blank lines of a UTF-8 file (a BOM is skipped), split at line feeds only: JSON
    may hold U+2028 and other characters that str.splitlines() would split at."""
    data = file.read()
    try:
        content = data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        raise ConfigError(
            f"--file {getattr(file, 'name', '-')}: line {line} is not UTF-8"
            f" (byte {data[exc.start]:#04x} at offset {exc.start})"
        ) from None
    lines = (line.removesuffix("\r") for line in content.split("\n"))
    return [line for line in lines if line.strip()]


def _read_elements(elements: tuple[str, ...], file: BinaryIO | None, text: bool) -> list[JSON]:
    raw: list[str] = list(elements)
    if file is not None:
        raw += _read_lines(file)
    if not raw:
        raise click.UsageError("give at least one ELEMENT, or --file")
    if text:
        return list(raw)
    return [parse_json(item) for item in raw]


@cli.command(short_help="Add elements to QUEUE, or move them if already queued.")
@click.argument("queue")
@click.argument("elements", nargs=-1, metavar="ELEMENT...")
@click.option(
    "--file", type=click.File("rb"), help="Also read elements from this UTF-8 file, one a line."
)
@click.option("--text", is_flag=True, help="Elements are plain strings (URLs), not JSON.")
@click.option("--delay", default=0.0, show_default=True, help="Seconds until the elements are due.")
@click.option(
    "--priority", default=0, show_default=True, help="Higher runs first among due elements."
)
@click.option("--only-if-earlier", is_flag=True, help="Move a queued element only forward in time.")
@click.option("--only-if-new", is_flag=True, help="Keep an element that is already queued.")
@click.option("--revisit", is_flag=True, help="Schedule even if the queue has seen it finish.")
@app_option
@backend_option
def schedule(
    queue: str,
    elements: tuple[str, ...],
    file: BinaryIO | None,
    text: bool,
    delay: float,
    priority: int,
    only_if_earlier: bool,
    only_if_new: bool,
    revisit: bool,
    app_spec: str | None,
    backend_url: str | None,
) -> None:
    """Add ELEMENTs (JSON) to QUEUE, or move them if they are already queued."""
    values = _read_elements(elements, file, text)
    app, url = resolve_url(app_spec, backend_url)
    options: dict[str, Any] = {
        "seconds": delay,
        "priority": priority,
        "only_if_earlier": only_if_earlier,
        "only_if_new": only_if_new,
        "revisit": revisit,
    }

    async def main() -> ScheduleResult:
        async with connected(url, create=app is not None) as backend:
            if app is not None:
                await app.publish(backend)
            return await (app or App(url)).aschedule_many(queue, values, backend=backend, **options)

    _report(run(main))


def _report(result: ScheduleResult) -> None:
    click.echo(
        f"added {result.added}, moved {result.moved}, kept {result.kept},"
        f" deferred {result.deferred} (running), skipped {result.skipped_seen} (seen)"
    )


@cli.command(short_help="Schedule the starting tasks of MODULE:APP (or those named).")
@click.argument("app_spec", metavar="MODULE:APP")
@click.argument("tasks", nargs=-1, metavar="[TASK]...")
@click.option("--element", default="null", show_default=True, help="JSON handed to the tasks.")
def start(app_spec: str, tasks: tuple[str, ...], element: str) -> None:
    """Schedule the starting tasks of MODULE:APP (all of them, or those named)."""
    app = load_app(app_spec)
    value = parse_json(element)
    chosen = [app.tasks[t] for t in tasks if t in app.tasks] if tasks else app.start_tasks
    missing = [t for t in tasks if t not in app.tasks]
    if missing:
        raise click.UsageError(f"no task named {', '.join(missing)} in {app_spec}")
    if not chosen:
        raise click.UsageError(f"{app_spec} has no task marked start=True; name one")

    async def main() -> ScheduleResult:
        async with connected(app.url, create=True) as backend:
            await app.publish(backend)
            total = ScheduleResult()
            for task in chosen:
                total += await app.aschedule_many(task, [value], backend=backend)
            return total

    _report(run(main))


@cli.command(short_help="Run a nightly ETL end to end on local sites (no network).")
@click.option(
    "--out",
    type=click.Path(file_okay=False, path_type=Path),
    default="crawlq-demo",
    show_default=True,
    help="Folder of the run's queue, WARC files, results, report and exports (emptied first).",
)
@click.option("--reports", default=1000, show_default=True, help="Reports the partners serve.")
@click.option("--latency", default=0.02, show_default=True, help="Seconds each answer takes.")
@click.option(
    "--errors", default=0.02, show_default=True, help="Share of reports failing once (503/500)."
)
@click.option("--no-progress", is_flag=True, help="No live progress display.")
def demo(out: Path, reports: int, latency: float, errors: float, no_progress: bool) -> None:
    """Run a nightly ETL end to end on local partner sites: login, 4 requests at once per
    sub-domain, one egress proxy, HTML/CSV/JSON parsers, a normalizer, a published report."""
    from rich.console import Console

    from ..demo import run_demo

    if reports < 1 or latency < 0 or not 0 <= errors < 1:
        raise click.UsageError("--reports >= 1, --latency >= 0, 0 <= --errors < 1")
    console = Console(soft_wrap=True)
    asyncio.run(
        run_demo(
            out,
            reports=reports,
            latency=latency,
            errors=errors,
            progress=not no_progress,
            console=console,
        )
    )


cli.add_command(stats)
cli.add_command(dead)
cli.add_command(limits)
cli.add_command(check)
cli.add_command(crawl)
cli.add_command(dashboard)
cli.add_command(reprocess)
cli.add_command(export)
cli.add_command(warc)


def _log_format_option(ctx: click.Context, _param: click.Parameter, value: str) -> str:
    os.environ["CRAWLQ_LOG_FORMAT"] = value  # worker processes started from here inherit it
    ctx.meta["crawlq.log_format"] = value
    return value


def _observable(command: click.Command) -> None:
    """Gives `command` (and every subcommand) --log-level and --log-format, and sets logging
    up before it runs."""
    if isinstance(command, click.Group):
        for sub in command.commands.values():
            _observable(sub)
        return
    names = {p.name for p in command.params}
    if "log_level" not in names:
        log_level_option(command)
    command.params.append(
        click.Option(
            ["--log-format"],
            type=click.Choice(["text", "json"]),
            default="text",
            envvar="CRAWLQ_LOG_FORMAT",
            show_envvar=True,
            show_default=True,
            expose_value=False,
            callback=_log_format_option,
            help="Log lines as text, or as JSON lines (task lines name queue, key, attempt,"
            " group and worker).",
        )
    )
    original = command.callback
    if original is None:
        return
    takes_level = "log_level" in names

    def with_logging(*args: Any, **kwargs: Any) -> Any:
        ctx = click.get_current_context()
        level = kwargs["log_level"] if takes_level else kwargs.pop("log_level")
        configure_logging(level, ctx.meta.get("crawlq.log_format", "text"))
        return original(*args, **kwargs)

    command.callback = with_logging


for _command in cli.commands.values():
    _observable(_command)


def main() -> None:
    cli(prog_name="crawlq")
