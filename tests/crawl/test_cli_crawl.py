"""`crawlq crawl` in a subprocess against the synthetic web: stopped with Ctrl-C (SIGINT) or
killed (SIGKILL) mid-crawl, then the same command finishes the crawl."""

from __future__ import annotations

import asyncio
import signal
import sys
from collections import Counter
from pathlib import Path

from aiohttp import web

from crawlq.crawl.crawler import PAGES_FILE, WARC_DIR
from crawlq.crawl.records import read_records
from crawlq.crawl.store import WarcStore
from crawlq.crawl.testing import Site, SyntheticWeb
from crawlq.crawl.testing.sites import page_html

PAGES = 20
GUARD = 60.0  # seconds: only a failing test ever waits this long


class Gate:
    """Pages answer at once until `after` were served; later ones wait for `release`."""

    def __init__(self, after: int) -> None:
        self.after = after
        self.served = 0
        self.reached = asyncio.Event()
        self.release = asyncio.Event()

    async def page(self, request: web.Request) -> web.StreamResponse:
        self.served += 1
        if self.served > self.after:
            self.reached.set()
            await self.release.wait()
        number = int(request.path.rsplit("/", 1)[1])
        links = [f"/page/{n}" for n in (number + 1, 2 * number + 1, 2 * number + 2) if n < PAGES]
        return web.Response(text=page_html(f"page {number}", links), content_type="text/html")


async def run_crawl(net: SyntheticWeb, out: Path, *extra: str) -> asyncio.subprocess.Process:
    return await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "crawlq",
        "crawl",
        net.url("site.test"),
        "--out",
        str(out),
        "--resolve",
        f"site.test={net.addresses['site.test']}",
        "--resolve-only",
        "--allow-network",
        "127.0.0.0/8",
        "--no-progress",
        "--concurrency-per-domain",
        "2",
        "--retry-delay",
        "0.05",
        *extra,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )


async def finish(process: asyncio.subprocess.Process) -> str:
    _, stderr = await asyncio.wait_for(process.communicate(), GUARD)
    return stderr.decode()


async def crawl_interrupted(tmp_path: Path, sig: signal.Signals) -> tuple[SyntheticWeb, Gate]:
    gate = Gate(after=6)
    site = Site(name="site.test", pages=PAGES)
    site.routes = {f"/page/{n}": gate.page for n in range(PAGES)}
    net = SyntheticWeb([site])
    await net.__aenter__()
    try:
        first = await run_crawl(net, tmp_path, "--lease", "4")
        await asyncio.wait_for(gate.reached.wait(), GUARD)
        first.send_signal(sig)
        if sig is signal.SIGINT:
            gate.release.set()  # the pages in flight may finish within the grace period
        stderr = await finish(first)
        gate.release.set()
        if sig is signal.SIGINT:
            assert first.returncode == 0, stderr
            assert "run the same command again to continue" in stderr
        else:
            assert first.returncode == -signal.SIGKILL
        gate.after = PAGES * 10
        second = await run_crawl(net, tmp_path, "--lease", "4")
        stderr = await finish(second)
        assert second.returncode == 0, stderr
        assert "done:" in stderr and "0 left in the queue" in stderr
    finally:
        await net.__aexit__(None, None, None)
    return net, gate


def fetched_pages(net: SyntheticWeb) -> Counter[str]:
    return Counter(h.path for h in net.hits if h.path.startswith("/page/"))


async def test_ctrl_c_then_the_same_command_finishes_without_fetching_anything_twice(
    tmp_path: Path,
) -> None:
    net, _ = await crawl_interrupted(tmp_path, signal.SIGINT)
    assert fetched_pages(net) == Counter({f"/page/{n}": 1 for n in range(PAGES)})
    records = read_records(tmp_path / PAGES_FILE)
    assert sorted(str(r["url"]) for r in records) == sorted(net.page_urls("site.test"))
    store = WarcStore(tmp_path / WARC_DIR)
    assert all(len(store.refs(url)) == 1 for url in net.page_urls("site.test"))


async def test_killed_then_the_same_command_finishes_the_crawl(tmp_path: Path) -> None:
    net, gate = await crawl_interrupted(tmp_path, signal.SIGKILL)
    pages = fetched_pages(net)
    assert set(pages) == {f"/page/{n}" for n in range(PAGES)}
    # Only pages in flight (or done but not yet acknowledged) at the kill run twice.
    assert sum(pages.values()) - PAGES <= sum(1 for c in pages.values() if c > 1)
    done = {str(r["url"]) for r in read_records(tmp_path / PAGES_FILE) if r["status"] == 200}
    assert done == set(net.page_urls("site.test"))
    assert gate.served >= PAGES
