"""`crawlq crawl --processes N`: N worker processes share one crawl (queue, page budget,
output folder) under a parent that seeds once, shows their progress and sums up."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from collections import Counter
from collections.abc import Callable
from pathlib import Path

from aiohttp import web

from crawlq.crawl.crawler import PAGES_FILE, WARC_DIR
from crawlq.crawl.records import read_records
from crawlq.crawl.testing import Site, SyntheticWeb
from crawlq.crawl.testing.sites import page_html

SITES = ["a.test", "b.test", "c.test"]
PAGES = 40
LIMIT = 2
GUARD = 120.0  # seconds: only a failing test ever waits this long


async def start(
    net: SyntheticWeb, out: Path, *extra: str, own_session: bool = False
) -> asyncio.subprocess.Process:
    command = [sys.executable, "-m", "crawlq", "crawl", *(net.url(s) for s in SITES)]
    for name, address in net.resolve.items():
        command += ["--resolve", f"{name}={address}"]
    command += ["--resolve-only", "--allow-network", "127.0.0.0/8", "--out", str(out)]
    command += ["--concurrency-per-domain", str(LIMIT), "--processes", "2", *extra]
    return await asyncio.create_subprocess_exec(
        *command,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        start_new_session=own_session,
    )


class Output:
    """The lines a process writes, read as they come."""

    def __init__(self, stream: asyncio.StreamReader) -> None:
        self.text = ""
        self._changed = asyncio.Event()
        self._reading = asyncio.create_task(self._read(stream))

    async def _read(self, stream: asyncio.StreamReader) -> None:
        async for line in stream:
            self.text += line.decode()
            self._changed.set()

    async def until(self, condition: Callable[[str], bool], what: str) -> None:
        async with asyncio.timeout(GUARD):
            while not condition(self.text):
                self._changed.clear()
                await self._changed.wait()
        assert condition(self.text), what

    async def closed(self) -> str:
        await asyncio.wait_for(self._reading, GUARD)
        return self.text


async def test_two_processes_crawl_every_page_once_within_the_limits(tmp_path: Path) -> None:
    async with SyntheticWeb([Site(name=s, pages=PAGES, latency=0.01) for s in SITES]) as net:
        process = await start(net, tmp_path, "--no-progress")
        _, stderr = await asyncio.wait_for(process.communicate(), GUARD)
        text = stderr.decode()
        assert process.returncode == 0, text
        fetched = Counter((h.host, h.path) for h in net.hits if h.path.startswith("/page/"))
        assert fetched == Counter({(s, f"/page/{n}"): 1 for s in SITES for n in range(PAGES)})
        assert all(net.peak_concurrency(s) <= LIMIT for s in SITES)

    records = read_records(tmp_path / PAGES_FILE)
    assert len(records) == len(SITES) * PAGES
    assert {r["error"] for r in records} == {None}
    # One WARC run per process that fetched (the pid is in the name), never the parent's. On a
    # loaded machine one process may take every page before the other has started.
    writers = {path.name.split("-")[2] for path in (tmp_path / WARC_DIR).glob("*.warc.gz")}
    assert 1 <= len(writers) <= 2 and str(process.pid) not in writers, writers
    assert f"done: {len(SITES) * PAGES} pages fetched, 0 errors, 0 throttled this run" in text
    assert "this run in 2 processes" in text
    assert "0 left in the queue" in text


async def test_two_processes_fetch_each_robots_txt_once_and_both_obey_it(tmp_path: Path) -> None:
    rules = "User-agent: *\nDisallow: /page/13\n"
    sites = [Site(name=s, pages=PAGES, latency=0.01, robots=rules) for s in SITES]
    async with SyntheticWeb(sites) as net:
        process = await start(net, tmp_path, "--no-progress")
        _, stderr = await asyncio.wait_for(process.communicate(), GUARD)
        assert process.returncode == 0, stderr.decode()
        robots = Counter(h.host for h in net.hits if h.path == "/robots.txt")
        fetched = {(h.host, h.path) for h in net.hits if h.path.startswith("/page/")}
    # Each site's other pages are found on its /page/0, fetched after its robots.txt.
    assert robots == Counter({s: 1 for s in SITES})
    assert fetched == {(s, f"/page/{n}") for s in SITES for n in range(PAGES) if n != 13}


async def test_ctrl_c_stops_every_process_and_the_same_command_finishes(tmp_path: Path) -> None:
    reached, release = asyncio.Event(), asyncio.Event()

    async def held(request: web.Request) -> web.StreamResponse:
        reached.set()
        await release.wait()  # a page of a.test is held open: the crawl cannot finish
        number = int(request.path.rsplit("/", 1)[1])
        links = [f"/page/{n}" for n in (number + 1, 2 * number + 1, 2 * number + 2) if n < PAGES]
        return web.Response(text=page_html(f"page {number}", links), content_type="text/html")

    sites = [Site(name=s, pages=PAGES) for s in SITES]
    sites[0].routes = {f"/page/{n}": held for n in range(5, PAGES)}
    async with SyntheticWeb(sites) as net:
        first = await start(net, tmp_path)
        await asyncio.wait_for(reached.wait(), GUARD)
        first.send_signal(signal.SIGINT)
        release.set()
        _, stderr = await asyncio.wait_for(first.communicate(), GUARD)
        assert first.returncode == 0, stderr.decode()
        assert "run the same command again to continue" in stderr.decode()

        second = await start(net, tmp_path, "--no-progress")
        _, stderr = await asyncio.wait_for(second.communicate(), GUARD)
        assert second.returncode == 0, stderr.decode()
        assert "0 left in the queue" in stderr.decode()
        pages = {(h.host, h.path) for h in net.hits if h.path.startswith("/page/")}
        assert pages == {(s, f"/page/{n}") for s in SITES for n in range(PAGES)}


async def test_one_ctrl_c_at_the_terminal_lets_each_process_finish_its_pages(
    tmp_path: Path,
) -> None:
    """A Ctrl-C at a terminal signals its whole foreground process group: each child must get
    one stop (the running pages get --grace to finish), not two (hurry: cancelled)."""
    reached: list[str] = []
    all_held, release = asyncio.Event(), asyncio.Event()

    async def held(request: web.Request) -> web.StreamResponse:
        reached.append(f"http://{request.host}{request.path}")
        if len(reached) == len(SITES) * LIMIT:
            all_held.set()
        await release.wait()
        number = int(request.path.rsplit("/", 1)[1])
        links = [f"/page/{n}" for n in (number + 1, 2 * number + 1, 2 * number + 2) if n < PAGES]
        return web.Response(text=page_html(f"page {number}", links), content_type="text/html")

    sites = [
        Site(name=s, pages=PAGES, routes={f"/page/{n}": held for n in range(1, PAGES)})
        for s in SITES
    ]
    async with SyntheticWeb(sites) as net:
        process = await start(
            net, tmp_path, "--grace", "60", "--log-level", "info", own_session=True
        )
        assert process.stderr is not None
        output = Output(process.stderr)
        await output.until(lambda text: text.count(" started on ") == 2, "two workers")
        await asyncio.wait_for(all_held.wait(), GUARD)  # two pages of each site in flight
        in_flight = sorted(reached)
        os.killpg(process.pid, signal.SIGINT)  # as a terminal does
        await output.until(lambda text: text.count(" stopping: ") == 2, "both workers stopping")
        release.set()
        text = await output.closed()
        await asyncio.wait_for(process.wait(), GUARD)

    assert process.returncode == 0, text
    assert "hurrying" not in text, text
    recorded = {str(r["url"]) for r in read_records(tmp_path / PAGES_FILE) if r["error"] is None}
    assert set(in_flight) <= recorded, text
    assert "run the same command again to continue" in text
