"""`crawlq crawl SEED...`: a polite crawl with no user code, resumable by running it again."""

from __future__ import annotations

import asyncio
import contextlib
import errno
import json
import os
import sqlite3
import sys
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

import click

from .. import checks
from ..errors import ConfigError
from ..observe.logs import logger
from .common import log_level_option, setup_logging

if TYPE_CHECKING:
    from ..crawl.crawler import Crawl, CrawlStats
    from ..crawl.progress import Snapshot
    from ..retry import Retry

log = logger("crawlq.crawl")

CHILD = "CRAWLQ_CRAWL_CHILD"
#: How often a child process reports its counts to the parent.
REPORT_INTERVAL = 0.5
#: The errors of a disk that cannot take the crawl's outputs.
_DISK_ERRORS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EIO, errno.EFBIG})


def _resolve_map(pairs: tuple[str, ...]) -> dict[str, str]:
    mapping = {}
    for pair in pairs:
        host, sep, address = pair.partition("=")
        if not sep or not host or not address:
            raise click.BadParameter(f"expected HOST=ADDRESS, got {pair!r}", param_hint="--resolve")
        mapping[host.strip().lower()] = address.strip()
    return mapping


@click.command()
@click.argument("seeds", nargs=-1, required=True, metavar="SEED...")
@click.option(
    "--allow-domain",
    "domains",
    multiple=True,
    help="Stay within this domain and its sub-domains (repeatable) [default: the seeds'].",
)
@click.option(
    "--include",
    multiple=True,
    help="Follow only URLs matching one of these regexes (repeatable) [default: any URL].",
)
@click.option(
    "--exclude", multiple=True, help="Never follow URLs matching this regex (repeatable)."
)
@click.option(
    "--max-pages",
    type=int,
    default=None,
    help="Admit at most this many distinct URLs, over every run of the crawl [default: no limit].",
)
@click.option(
    "--depth",
    type=int,
    default=None,
    help="Follow links at most this many hops from a seed [default: no limit].",
)
@click.option(
    "--concurrency-per-domain", default=2, show_default=True, help="Requests at once per host."
)
@click.option("--delay", default=0.0, show_default=True, help="Seconds between requests to a host.")
@click.option(
    "--out",
    default="crawl",
    show_default=True,
    type=click.Path(file_okay=False, path_type=Path),
    help="Folder of the WARC files, pages.jsonl and (by default) the queue.",
)
@click.option(
    "--backend",
    "backend_url",
    envvar="CRAWLQ_BACKEND",
    show_envvar=True,
    default=None,
    help="Backend URL [default: sqlite:///OUT/queue.db].",
)
@click.option(
    "--concurrency", default=200, show_default=True, help="Pages fetched at once per process."
)
@click.option(
    "-p",
    "--processes",
    default=1,
    show_default=True,
    type=click.IntRange(min=1),
    help="Worker processes sharing the crawl (for CPU-bound crawls on several cores).",
)
@click.option(
    "--resolve",
    "resolve",
    multiple=True,
    metavar="HOST=ADDRESS",
    help="Resolve HOST to ADDRESS without DNS (repeatable).",
)
@click.option("--resolve-only", is_flag=True, help="Refuse hosts not given with --resolve.")
@click.option(
    "--allow-network",
    "allow_networks",
    multiple=True,
    metavar="CIDR",
    help="Let requests reach this private or loopback network (repeatable); refused otherwise.",
)
@click.option(
    "--proxy",
    "proxies",
    multiple=True,
    envvar="CRAWLQ_PROXY",
    show_envvar=True,
    help="Egress proxy; several rotate (in the env variable, space-separated: what it holds"
    " stays out of the command line, which other users of the machine can read).",
)
@click.option(
    "--ca-file",
    type=click.Path(exists=True, dir_okay=False),
    default=None,
    help="CA bundle to verify https certificates with [default: the system's].",
)
@click.option(
    "--user-agent",
    default=None,
    help="User-Agent header (and robots.txt agent) [default: crawlq's own].",
)
@click.option("--timeout", default=30.0, show_default=True, help="Seconds per request.")
@click.option("--max-bytes", default=10 * 2**20, show_default=True, help="Largest body accepted.")
@click.option("--max-attempts", default=3, show_default=True, help="Tries of a failing page.")
@click.option(
    "--retry-delay", default=5.0, show_default=True, help="Seconds before the first retry."
)
@click.option(
    "--warc-size", default=1 << 30, show_default=True, help="Bytes per WARC file before rotating."
)
@click.option(
    "--warc-level",
    type=click.IntRange(0, 9),
    default=6,
    show_default=True,
    help="gzip level of the WARC records: 1 costs about half the CPU of 6 for ~13% more bytes.",
)
@click.option("--lease", default=60.0, show_default=True, help="Seconds a page is leased.")
@click.option("--grace", default=10.0, show_default=True, help="Seconds to finish on Ctrl-C.")
@click.option(
    "--render",
    is_flag=True,
    help="Render HTML pages in headless Chromium and follow the links of the rendered DOM;"
    " every request a page makes goes through the crawl's fetcher and politeness"
    " (needs the browser extra: pip install 'crawlq[browser]').",
)
@click.option(
    "--chromium",
    envvar="CRAWLQ_CHROMIUM",
    show_envvar=True,
    default="/usr/bin/chromium",
    show_default=True,
    help="The Chromium --render runs (Playwright never downloads one).",
)
@click.option(
    "--render-pages", default=4, show_default=True, help="Pages rendered at once per process."
)
@click.option(
    "--render-timeout", default=30.0, show_default=True, help="Seconds a page may take to render."
)
@click.option(
    "--resource-domain",
    "resource_domains",
    multiple=True,
    help="Let rendered pages load scripts and data from this domain too (a CDN), although"
    " its pages are not crawled (repeatable).",
)
@click.option(
    "--render-media",
    is_flag=True,
    help="Let rendered pages fetch images, media and fonts (skipped by default).",
)
@click.option("--progress/--no-progress", default=True, help="Show the live progress line.")
@log_level_option
def crawl(
    seeds: tuple[str, ...],
    domains: tuple[str, ...],
    include: tuple[str, ...],
    exclude: tuple[str, ...],
    max_pages: int | None,
    depth: int | None,
    concurrency_per_domain: int,
    delay: float,
    out: Path,
    backend_url: str | None,
    concurrency: int,
    processes: int,
    resolve: tuple[str, ...],
    resolve_only: bool,
    allow_networks: tuple[str, ...],
    proxies: tuple[str, ...],
    ca_file: str | None,
    user_agent: str | None,
    timeout: float,
    max_bytes: int,
    max_attempts: int,
    retry_delay: float,
    warc_size: int,
    warc_level: int,
    lease: float,
    grace: float,
    render: bool,
    chromium: str,
    render_pages: int,
    render_timeout: float,
    resource_domains: tuple[str, ...],
    render_media: bool,
    progress: bool,
    log_level: str,
) -> None:
    """Crawl from SEEDs: WARC files and pages.jsonl in OUT. Stop with Ctrl-C; the same
    command again continues where it stopped."""
    from ..crawl.browser import BrowserSettings
    from ..crawl.crawler import Crawl, CrawlSettings
    from ..crawl.scope import Scope
    from ..crawl.settings import DEFAULT_USER_AGENT, FetchSettings, Timeouts
    from ..crawl.urls import MAX_URL_LENGTH, canonicalize
    from ..grouping import registered_domain, url_host

    for seed in seeds:  # before anything is made in OUT
        if canonicalize(seed) is None:
            raise click.BadParameter(
                f"{seed[:200]!r} is not an absolute http or https URL (such as"
                f" https://example.org/) of at most {MAX_URL_LENGTH} characters",
                param_hint="SEED",
            )
    setup_logging(log_level)
    retry = _retry(max_attempts, retry_delay)
    grace = checks.seconds(grace, "--grace")
    timeout = checks.seconds(timeout, "--timeout")
    render_timeout = checks.seconds(render_timeout, "--render-timeout")
    render_pages = checks.integer(render_pages, "--render-pages", low=1)
    allowed = domains or tuple(sorted({registered_domain(url_host(seed)) for seed in seeds}))
    settings = CrawlSettings(
        out=out,
        scope=Scope(domains=allowed, include=include, exclude=exclude, max_depth=depth),
        max_pages=max_pages,
        fetch=FetchSettings(
            user_agent=user_agent or DEFAULT_USER_AGENT,
            timeouts=Timeouts(connect=min(10.0, timeout), read=timeout, total=timeout),
            max_bytes=max_bytes,
            proxies=proxies,
            ca_file=ca_file,
            resolve=_resolve_map(resolve),
            resolve_only=resolve_only,
            allow_networks=allow_networks,
        ),
        concurrency_per_domain=concurrency_per_domain,
        delay=delay,
        retry=retry,
        lease=lease,
        max_file_bytes=warc_size,
        warc_level=warc_level,
        render=render,
        browser=BrowserSettings(
            executable=chromium,
            pages=render_pages,
            timeout=render_timeout,
            media=render_media,
            resource_domains=resource_domains,
        ),
    )
    _make_folder(out)
    crawl = Crawl(settings, backend=backend_url)
    if processes > 1 and CHILD not in os.environ:
        if sys.argv[1:2] != ["crawl"]:
            raise ConfigError("--processes works from the command line (crawlq crawl ...)")
        asyncio.run(_supervise(crawl, seeds, processes, progress))
    else:
        try:
            asyncio.run(_crawl(crawl, seeds, concurrency, grace, progress))
        except (OSError, sqlite3.Error) as exc:  # closing the outputs, after the worker stopped
            if isinstance(exc, OSError) and exc.errno not in _DISK_ERRORS:
                raise
            raise _outputs_lost(exc) from None


def _retry(max_attempts: int, retry_delay: float) -> Retry:
    """The crawl's Retry, its options checked as the command line names them."""
    from ..retry import Retry

    max_attempts = checks.integer(max_attempts, "--max-attempts", low=1)
    retry_delay = checks.seconds(retry_delay, "--retry-delay")
    return Retry(max_attempts=max_attempts, base=retry_delay)  # checks the rest itself


def _make_folder(out: Path) -> None:
    """The output folder, made if need be, refused at once if it cannot be written: the crawl
    would stop at its first page."""
    from ..crawl.crawler import PAGES_FILE, WARC_DIR

    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigError(
            f"--out {str(out)!r}: cannot make the folder: {exc.strerror or exc}"
        ) from None
    warc = out / WARC_DIR
    try:
        warc.mkdir(exist_ok=True)
        with open(out / PAGES_FILE, "ab"), tempfile.TemporaryFile(dir=warc):
            pass
    except OSError as exc:
        where = exc.filename if exc.filename and Path(exc.filename).parent != warc else warc
        raise ConfigError(
            f"--out {str(out)!r}: cannot write in the folder: {where}: {exc.strerror or exc}"
        ) from None


def _outputs_lost(error: BaseException) -> click.ClickException:
    """The crawl stopped as its outputs could not be written (a full disk): what to do."""
    return click.ClickException(
        f"the crawl stopped: its outputs could not be written ({type(error).__name__}: "
        f"{error}); its pages not yet done stay in the queue: make room (or make the folder"
        " writable) and run the same command again"
    )


async def _crawl(
    crawl: Crawl, seeds: tuple[str, ...], concurrency: int, grace: float, progress: bool
) -> None:
    from ..crawl.progress import render, snapshot
    from ..worker import Worker
    from ..worker.supervisor import end_with_parent

    worker = Worker(
        crawl.app, burst=True, burst_horizon=300.0, concurrency=concurrency, grace=grace
    )
    worker.install_signal_handlers()
    end_with_parent()
    child = CHILD in os.environ
    live = sys.stderr.isatty()
    shown = None
    try:
        # First: it opens the backend, which a display started meanwhile would open twice.
        await crawl.seed(seeds)
        if child:
            shown = asyncio.create_task(_report_counts(crawl.stats), name="crawlq-counts")
        elif progress:
            shown = asyncio.create_task(_show_progress(crawl, live), name="crawlq-progress")
        await worker.run()
        final = await snapshot(crawl, await crawl.app.backend())
    finally:
        await _end(shown)
        await crawl.aclose()
    if child:
        _report(crawl.stats)  # the parent sums up
    else:
        if live and progress:
            sys.stderr.write("\n")
        click.echo(render(final), err=True)
        _summary(crawl, final, _this_run(crawl.stats))
    if worker.outputs_lost is not None:
        raise _outputs_lost(worker.outputs_lost)


async def _show_progress(crawl: Crawl, live: bool) -> None:
    """The progress display: when it fails (the backend cannot be read), it stops, the crawl
    goes on."""
    from ..crawl.progress import show_progress

    try:
        await show_progress(crawl, sys.stderr, interval=0.5 if live else 5.0, live=live)
    except Exception as exc:
        log.warning("progress display stopped (the crawl goes on): %s: %s", type(exc).__name__, exc)


async def _end(task: asyncio.Task[None] | None) -> None:
    if task is not None:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


def _this_run(stats: CrawlStats) -> str:
    return (
        f"{stats.pages} pages fetched, {stats.errors} errors, {stats.throttled} throttled this run"
    )


def _summary(crawl: Crawl, final: Snapshot, this_run: str) -> None:
    left = final.queued + final.running
    click.echo(
        f"{'stopped' if left else 'done'}: {this_run} ({final.dead} dead); {left} left in the"
        f" queue{', run the same command again to continue' if left else ''}."
        f" Output in {crawl.out}",
        err=True,
    )


# -- several processes: a child reports its counts on its stdout, the parent sums them -----

_COUNTED = ("pages", "errors", "throttled")


def _report(stats: CrawlStats) -> None:
    counts = {name: getattr(stats, name) for name in _COUNTED}
    sys.stdout.write(json.dumps(counts, allow_nan=False) + "\n")
    sys.stdout.flush()


async def _report_counts(stats: CrawlStats) -> None:
    while True:
        await asyncio.sleep(REPORT_INTERVAL)
        _report(stats)


class _ChildCounts:
    """The latest counts each child process reported, summed into the parent's `stats`."""

    def __init__(self, stats: CrawlStats) -> None:
        self.stats = stats
        self.latest: dict[int, dict[str, int]] = {}

    async def read(self, slot: int, child: asyncio.subprocess.Process) -> None:
        assert child.stdout is not None
        async for line in child.stdout:
            counts = _counts(line)
            if counts is None:  # not a report: the child's own output
                sys.stdout.buffer.write(line)
                continue
            self.latest[slot] = counts
            for name in _COUNTED:
                setattr(self.stats, name, sum(c[name] for c in self.latest.values()))


def _counts(line: bytes) -> dict[str, int] | None:
    try:
        report = json.loads(line)
    except ValueError:
        return None
    if not isinstance(report, dict) or set(report) != set(_COUNTED):
        return None
    if not all(isinstance(value, int) for value in report.values()):
        return None
    return report


async def _supervise(crawl: Crawl, seeds: tuple[str, ...], processes: int, progress: bool) -> None:
    """Seeds once, then runs this same command line in `processes` child processes (which
    share the queue, the page budget and the output folder) and shows their progress."""
    from ..crawl.progress import render, snapshot
    from ..worker.supervisor import Children

    command = [sys.executable, "-m", "crawlq", *sys.argv[1:], "--no-progress"]
    children = Children(command, env_name=CHILD, stdout=asyncio.subprocess.PIPE)
    counts = _ChildCounts(crawl.stats)
    live = sys.stderr.isatty()
    shown = None
    try:
        await crawl.seed(seeds)
        backend = await crawl.app.backend()
        async with children.forwarding():
            started = await asyncio.gather(*(children.spawn(n) for n in range(processes)))
            running = [(n, child) for n, child in enumerate(started) if child is not None]
            if progress:
                shown = asyncio.create_task(_show_progress(crawl, live), name="crawlq-progress")
            await asyncio.gather(*(counts.read(n, child) for n, child in running))
            codes = [await child.wait() for _, child in running]
        final = await snapshot(crawl, backend)
    finally:
        await _end(shown)
        await crawl.aclose()
    if live and progress:
        sys.stderr.write("\n")
    click.echo(render(final), err=True)
    failed = sum(1 for code in codes if code != 0)
    _summary(
        crawl,
        final,
        f"{_this_run(crawl.stats)} in {processes} processes"
        + (f", {failed} of which exited with an error" if failed else ""),
    )
