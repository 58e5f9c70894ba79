"""`crawlq demo`: a polite crawl of a simulated web, end to end on the embedded SQLite backend.

Pages are made up (no network): each links to others of its site and sometimes to another
site, so the crawl discovers its work recursively and the queue's uniqueness stops loops.
Some pages fail once (retried with backoff), a few always fail (dead letters). The demo then
checks what it promises: every reachable page fetched once, per-site limits never exceeded.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import itertools
import sys
import time
from collections import defaultdict
from pathlib import Path
from urllib.parse import urlsplit

from .app import App
from .context import Context
from .retry import Retry
from .worker import Worker

SITE_CONCURRENCY = 2
SITE_INTERVAL = 0.02
LATENCY = 0.05


def _digest(text: str) -> int:
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=4).digest(), "big")


class SimulatedWeb:
    def __init__(self, sites: int, pages: int) -> None:
        self.sites = sites
        self.pages = pages
        self.fetches: dict[str, int] = defaultdict(int)
        self.active: dict[str, int] = defaultdict(int)
        self.peak: dict[str, int] = defaultdict(int)
        self.starts: dict[str, list[float]] = defaultdict(list)
        self.failed_once: set[str] = set()

    def url(self, site: int, page: int) -> str:
        return f"http://site-{site}.demo/page/{page}"

    def links(self, url: str) -> list[str]:
        parts = urlsplit(url)
        site = int((parts.hostname or "site-0").split("-")[1].split(".")[0])
        page = int(parts.path.rsplit("/", 1)[1])
        found = [
            self.url(site, (page * 2 + 1) % self.pages),
            self.url(site, (page * 2 + 2) % self.pages),
        ]
        if _digest(url) % 5 == 0:
            found.append(self.url((site + 1) % self.sites, page))
        return found

    async def fetch(self, url: str, started: float) -> list[str]:
        """`started` is when the queue let the request start (the claim), in epoch seconds."""
        host = urlsplit(url).hostname or ""
        self.fetches[url] += 1
        self.active[host] += 1
        self.peak[host] = max(self.peak[host], self.active[host])
        self.starts[host].append(started)
        try:
            await asyncio.sleep(LATENCY)
            kind = _digest(url) % 50
            if kind == 7:
                raise ConnectionError(f"{url}: connection reset (simulated, always)")
            if kind in (3, 4) and url not in self.failed_once:
                self.failed_once.add(url)
                raise TimeoutError(f"{url}: timed out (simulated, once)")
            return self.links(url)
        finally:
            self.active[host] -= 1


def build_app(db: str, web: SimulatedWeb) -> App:
    app = App(f"sqlite:///{db}")
    app.limit("*.demo", concurrency=SITE_CONCURRENCY, interval=SITE_INTERVAL)

    @app.task(start=True)
    async def seed(ctx: Context, _: None) -> None:
        await ctx.schedule_many(fetch, [web.url(site, 0) for site in range(web.sites)])

    @app.task(retry=Retry(max_attempts=3, base=0.1, cap=1.0), lease=30, seen=True)
    async def fetch(ctx: Context, url: str) -> None:
        links = await web.fetch(url, ctx.claimed_at)
        await ctx.schedule_many(fetch, links, only_if_new=True)

    return app


async def _progress(app: App, stop: asyncio.Event) -> None:
    while not stop.is_set():
        stats = {s.name: s for s in await (await app.backend()).queue_stats(["fetch"])}
        fetch = stats.get("fetch")
        if fetch is not None:
            sys.stderr.write(
                f"\rqueued {fetch.total - fetch.running:5d}  running {fetch.running:3d}"
                f"  dead {fetch.dead:3d}"
            )
            sys.stderr.flush()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), 0.5)
    sys.stderr.write("\n")


async def run_demo(db: str, *, sites: int, pages: int) -> None:
    for suffix in ("", "-wal", "-shm"):
        Path(db + suffix).unlink(missing_ok=True)
    web = SimulatedWeb(sites, pages)
    app = build_app(db, web)
    print(
        f"crawling {sites} simulated sites of {pages} pages, at most {SITE_CONCURRENCY}"
        f" requests at once and {SITE_INTERVAL}s apart per site, into {db}"
    )
    started = time.monotonic()
    await app.aschedule_many("seed", [None])
    stop = asyncio.Event()
    progress = asyncio.create_task(_progress(app, stop))
    result = await Worker(app, burst=True, concurrency=100, burst_horizon=5).run()
    stop.set()
    await progress
    elapsed = time.monotonic() - started
    backend = await app.backend()
    dead = await backend.dead_letters("fetch", limit=1000)
    await app.aclose()

    peak = max(web.peak.values())
    gaps = [b - a for starts in web.starts.values() for a, b in itertools.pairwise(sorted(starts))]
    refetched = sum(1 for n in web.fetches.values() if n > 1)
    print(
        f"fetched {len(web.fetches)} distinct pages in {elapsed:.1f}s"
        f" ({result.done} tasks done, {result.failed} failures retried or dead)"
    )
    example = dead[0].payload if dead else "-"
    print(f"dead letters: {len(dead)} (pages that always fail), e.g. {example}")
    print(
        f"politeness: peak {peak} requests at once per site (limit {SITE_CONCURRENCY}),"
        f" shortest gap between starts {min(gaps, default=0):.3f}s (limit {SITE_INTERVAL}s)"
    )
    print(f"pages fetched more than once: {refetched} (only retries of failed fetches)")
    print(f"inspect it: crawlq stats --backend sqlite:///{db}")
