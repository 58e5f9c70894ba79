"""`crawlq warc`: a crawl's WARC files read against their index and put right (`check`), and
a stored response read back (`get`)."""

from __future__ import annotations

import sys
from datetime import UTC, datetime
from pathlib import Path

import click

from ..crawl.store import WarcStore
from ..crawl.warc import StoredResponse
from ..crawl.warc_check import CheckReport, check, warc_directory, warc_files
from ..observe.logs import printable, redact
from .common import Group, run

#: The stale rows listed one by one; past this many, only how many more.
SHOWN_ROWS = 20


@click.group(cls=Group)
def warc() -> None:
    """A crawl's stored responses (WARC files and their index)."""


@warc.command("check", short_help="Check WARC files against their index; --repair fixes them.")
@click.argument("path", type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.option(
    "--repair",
    is_flag=True,
    help="Index the records the index lacks, drop its rows that lead to no whole record and"
    " cut off torn tails (refused while a crawl writes there).",
)
@click.option("--progress/--no-progress", default=None, help="Default: on a terminal.")
def warc_check(path: Path, repair: bool, progress: bool | None) -> None:
    """Scan the WARC files of PATH (a WARC folder, or a crawl's --out or a pipeline's data
    folder holding warc/) record by record and compare the index with them.

    Exits 0 when every record is indexed, every row leads to a whole record, every file ends
    whole (after --repair: once it made them so) and no file is damaged in the middle (the
    records there are lost: nothing repairs that), 1 otherwise."""
    directory = warc_directory(path)
    total = sum(f.stat().st_size for f in warc_files(directory))
    if progress is None:
        progress = sys.stderr.isatty()
    if progress and total:
        from rich.progress import BarColumn, DownloadColumn, Progress, TimeRemainingColumn

        columns = (BarColumn(), DownloadColumn(), TimeRemainingColumn())
        with Progress(*columns, transient=True) as bar:
            task = bar.add_task("scan", total=total)
            report = check(directory, repair=repair, progress=lambda n: bar.advance(task, n))
    else:
        report = check(directory, repair=repair)
    for line in describe(report):
        click.echo(line)
    if report.damaged or not (report.clean or report.repaired):
        sys.exit(1)


@warc.command("get", short_help="Write the body of a URL's latest stored response.")
@click.argument("path", type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.argument("url")
@click.option("--head", is_flag=True, help="Print the status, fetch time and headers instead.")
def warc_get(path: Path, url: str, head: bool) -> None:
    """Write the body of URL's latest stored response (its Content-Encoding undone, as the
    server sent it otherwise) to standard output, from the WARC files of PATH (as for
    `check`). Nothing is fetched; exits 1 when URL has no stored response."""
    store = WarcStore(warc_directory(path))

    async def latest() -> StoredResponse | None:
        try:
            return await store.get(url)
        finally:
            await store.aclose()

    response = run(latest)
    if response is None:
        shown = printable(redact(url), one_line=True)
        raise click.ClickException(f"no stored response for {shown}")
    if head:
        fetched = datetime.fromtimestamp(response.fetched_at, UTC).isoformat()
        click.echo(f"{response.status} {printable(response.url, one_line=True)}")
        click.echo(f"fetched at {fetched}")
        for name, value in response.headers:
            click.echo(printable(f"{name}: {value}", one_line=True))
        return
    sys.stdout.buffer.write(response.body)
    sys.stdout.buffer.flush()


def describe(report: CheckReport) -> list[str]:
    """The report as lines a person reads (names and URLs escaped: they come from crawls)."""
    size = sum(f.size for f in report.files)
    lines = [
        f"{report.directory}: {len(report.files)} files, {report.records:,} records,"
        f" {size / 1e6:,.1f} MB"
    ]
    for scan in report.files:
        name = printable(scan.name, one_line=True)
        if scan.in_use:
            lines.append(f"{name}: being written (a running crawl holds it): left alone")
        elif scan.torn_at is not None:
            lines.append(
                f"{name}: torn tail: its last {scan.size - scan.torn_at:,} bytes (from"
                f" {scan.torn_at:,}) are part of a record, cut off"
            )
        for start, end, why in scan.damage:
            lines.append(
                f"{name}: damaged: bytes {start:,} to {end:,} hold no whole record"
                f" ({why}): the records there are lost"
            )
    if report.unindexed:
        lines.append(f"index: {len(report.unindexed):,} records not indexed")
    if report.stale:
        lines.append(f"index: {len(report.stale):,} rows lead to no whole record:")
        for row in report.stale[:SHOWN_ROWS]:
            lines.append(
                f"  {printable(row.url, one_line=True)} ({row.table}) in"
                f" {printable(row.file, one_line=True)} at {row.offset:,}: {row.why}"
            )
        if len(report.stale) > SHOWN_ROWS:
            lines.append(f"  ... and {len(report.stale) - SHOWN_ROWS:,} more")
    if report.clean:
        lines.append("every record indexed, every row a whole record, every file whole")
    elif report.repaired:
        lines.append(f"repaired: {_work(report, 'indexed', 'dropped', 'cut')}")
    else:
        work = _work(report, "index", "drop", "cut")
        lines.append(f"to repair (crawlq warc check --repair): {work}")
    return lines


def _work(report: CheckReport, index: str, drop: str, cut: str) -> str:
    parts = []
    if report.unindexed:
        parts.append(f"{index} {len(report.unindexed):,} records")
    if report.stale:
        parts.append(f"{drop} {len(report.stale):,} rows")
    if report.torn:
        parts.append(f"{cut} {len(report.torn):,} torn tails")
    return ", ".join(parts)
