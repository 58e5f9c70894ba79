"""`crawlq crawl SEED...`: a polite crawl with no user code, resumable by running it again."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import click

from ..errors import ConfigError
from .common import log_level_option, setup_logging

if TYPE_CHECKING:
    from ..crawl.crawler import Crawl
    from ..crawl.progress import Snapshot

CHILD = "CRAWLQ_CRAWL_CHILD"


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
@click.option("--include", multiple=True, help="Follow only URLs matching one such regex.")
@click.option("--exclude", multiple=True, help="Never follow URLs matching this regex.")
@click.option("--max-pages", type=int, default=None, help="Admit at most this many URLs in all.")
@click.option("--depth", type=int, default=None, help="Follow links this many hops from a seed.")
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
@click.option("--proxy", "proxies", multiple=True, help="Egress proxy; several rotate.")
@click.option(
    "--ca-file",
    type=click.Path(exists=True, dir_okay=False),
    default=None,
    help="CA bundle to verify https certificates with [default: the system's].",
)
@click.option("--user-agent", default=None, help="User-Agent header (and robots.txt agent).")
@click.option("--timeout", default=30.0, show_default=True, help="Seconds per request.")
@click.option("--max-bytes", default=10 * 2**20, show_default=True, help="Largest body accepted.")
@click.option("--max-attempts", default=3, show_default=True, help="Tries of a failing page.")
@click.option(
    "--retry-delay", default=5.0, show_default=True, help="Seconds before the first retry."
)
@click.option(
    "--warc-size", default=1 << 30, show_default=True, help="Bytes per WARC file before rotating."
)
@click.option("--lease", default=60.0, show_default=True, help="Seconds a page is leased.")
@click.option("--grace", default=10.0, show_default=True, help="Seconds to finish on Ctrl-C.")
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
    lease: float,
    grace: float,
    progress: bool,
    log_level: str,
) -> None:
    """Crawl from SEEDs: WARC files and pages.jsonl in OUT. Stop with Ctrl-C; the same
    command again continues where it stopped."""
    from ..crawl.crawler import Crawl, CrawlSettings
    from ..crawl.scope import Scope
    from ..crawl.settings import DEFAULT_USER_AGENT, FetchSettings, Timeouts
    from ..grouping import registered_domain, url_host
    from ..retry import Retry

    setup_logging(log_level)
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
        retry=Retry(max_attempts=max_attempts, base=retry_delay),
        lease=lease,
        max_file_bytes=warc_size,
    )
    crawl = Crawl(settings, backend=backend_url)
    if processes > 1 and CHILD not in os.environ:
        if sys.argv[1:2] != ["crawl"]:
            raise ConfigError("--processes works from the command line (crawlq crawl ...)")
        asyncio.run(_supervise(crawl, seeds, processes, progress))
    else:
        asyncio.run(_crawl(crawl, seeds, concurrency, grace, progress))


async def _crawl(
    crawl: Crawl, seeds: tuple[str, ...], concurrency: int, grace: float, progress: bool
) -> None:
    from ..crawl.progress import render, show_progress, snapshot
    from ..worker import Worker

    worker = Worker(
        crawl.app, burst=True, burst_horizon=300.0, concurrency=concurrency, grace=grace
    )
    worker.install_signal_handlers()
    live = sys.stderr.isatty()
    shown = None
    if progress:
        shown = asyncio.create_task(
            show_progress(crawl, sys.stderr, interval=0.5 if live else 5.0, live=live),
            name="crawlq-progress",
        )
    try:
        await crawl.seed(seeds)
        stats = await worker.run()
        final = await snapshot(crawl, await crawl.app.backend())
    finally:
        if shown is not None:
            shown.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await shown
        await crawl.aclose()
    if CHILD in os.environ:
        return  # the parent process sums up
    if live and progress:
        sys.stderr.write("\n")
    click.echo(render(final), err=True)
    _summary(crawl, final, f"{stats.done} pages this run, {stats.failed} failures")


def _summary(crawl: Crawl, final: Snapshot, this_run: str) -> None:
    left = final.queued + final.running
    click.echo(
        f"{'stopped' if left else 'done'}: {this_run} ({final.dead} dead); {left} left in the"
        f" queue{', run the same command again to continue' if left else ''}."
        f" Output in {crawl.out}",
        err=True,
    )


class _PagesTail:
    """Counts the page records every process appends to pages.jsonl since we started."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.offset = path.stat().st_size if path.exists() else 0
        self.pages = self.errors = 0

    def read(self) -> None:
        if not self.path.exists():
            return
        with open(self.path, "rb") as file:
            file.seek(self.offset)
            chunk = file.read()
        complete = chunk[: chunk.rfind(b"\n") + 1]  # a line being written waits for next time
        self.offset += len(complete)
        for line in complete.splitlines():
            if b'"error":null' in line:
                self.pages += 1
            else:
                self.errors += 1


async def _supervise(crawl: Crawl, seeds: tuple[str, ...], processes: int, progress: bool) -> None:
    """Seeds once, then runs this same command line in `processes` child processes (which
    share the queue, the page budget and the output folder) and shows their progress."""
    from ..crawl.crawler import PAGES_FILE
    from ..crawl.progress import render, snapshot

    tail = _PagesTail(crawl.out / PAGES_FILE)
    command = [sys.executable, "-m", "crawlq", *sys.argv[1:], "--no-progress"]
    children: list[asyncio.subprocess.Process] = []
    loop = asyncio.get_running_loop()

    def forward(signum: int) -> None:
        for child in children:
            if child.returncode is None:
                child.send_signal(signum)

    live = sys.stderr.isatty()
    try:
        await crawl.seed(seeds)
        backend = await crawl.app.backend()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, forward, sig)
        for number in range(processes):
            env = {**os.environ, CHILD: str(number)}
            children.append(await asyncio.create_subprocess_exec(*command, env=env))
        waiting = asyncio.ensure_future(asyncio.gather(*(c.wait() for c in children)))
        width = 0
        while not waiting.done():
            await asyncio.wait([waiting], timeout=0.5 if live else 5.0)
            tail.read()
            crawl.stats.pages, crawl.stats.errors = tail.pages, tail.errors
            if progress and not waiting.done():
                line = render(await snapshot(crawl, backend))
                sys.stderr.write(("\r" + line.ljust(width)) if live else line + "\n")
                sys.stderr.flush()
                width = len(line)
        codes = waiting.result()
        final = await snapshot(crawl, backend)
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(sig)
        for child in children:
            if child.returncode is None:
                child.kill()
                await child.wait()
        await crawl.aclose()
    if live and progress:
        sys.stderr.write("\n")
    click.echo(render(final), err=True)
    failed = sum(1 for code in codes if code != 0)
    _summary(
        crawl,
        final,
        f"{tail.pages} pages and {tail.errors} errors this run in {processes} processes"
        + (f", {failed} of which exited with an error" if failed else ""),
    )
