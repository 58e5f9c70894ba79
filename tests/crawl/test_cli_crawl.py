"""`crawlq crawl` in a subprocess against the synthetic web: stopped with Ctrl-C (SIGINT) or
killed (SIGKILL) mid-crawl, then the same command finishes the crawl."""

from __future__ import annotations

import asyncio
import signal
import sys
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest
from aiohttp import web

from crawlq.backends import Backend
from crawlq.cli import crawl as cli_crawl
from crawlq.crawl import progress
from crawlq.crawl.crawler import PAGES_FILE, WARC_DIR, Crawl, CrawlSettings
from crawlq.crawl.records import read_records
from crawlq.crawl.settings import Timeouts
from crawlq.crawl.store import WarcStore
from crawlq.crawl.testing import Site, SyntheticWeb, respond
from crawlq.crawl.testing.sites import page_html
from crawlq.errors import BackendError, ConfigError

from .conftest import crawl_settings, fetch_settings

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


async def run_crawl(
    net: SyntheticWeb, out: Path, *extra: str, preexec_fn: Callable[[], object] | None = None
) -> asyncio.subprocess.Process:
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
        preexec_fn=preexec_fn,
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


def linked_page(request: web.Request, pages: int) -> web.Response:
    number = int(request.path.rsplit("/", 1)[1])
    links = [f"/page/{n}" for n in (number + 1, 2 * number + 1, 2 * number + 2) if n < pages]
    return web.Response(text=page_html(f"page {number}", links), content_type="text/html")


@pytest.mark.parametrize("processes", [1, 2])
async def test_the_summary_counts_pages_errors_and_throttled_alike_in_one_or_more_processes(
    tmp_path: Path, processes: int
) -> None:
    """Six pages: one throttled once (then fetched), one too large (an error not retried): five
    pages fetched, one error, one throttled, whatever the number of processes."""
    asked = Counter[str]()

    async def throttled_once(request: web.Request) -> web.StreamResponse:
        asked[request.path] += 1
        if asked[request.path] == 1:
            return web.Response(status=429, text="slow down", headers={"Retry-After": "1"})
        return linked_page(request, 6)

    site = Site(name="site.test", pages=6)
    site.routes = {"/page/1": throttled_once, "/page/3": respond(200, "x" * 100_000)}
    async with SyntheticWeb([site]) as net:
        process = await run_crawl(
            net,
            tmp_path,
            "--max-bytes",
            "50000",
            "--concurrency-per-domain",
            "1",  # one page at a time: only the page that got the 429 is throttled
            "--processes",
            str(processes),
        )
        stderr = await finish(process)
    assert process.returncode == 0, stderr
    assert "5 pages (" in stderr and ", 1 errors, 0 dead" in stderr, stderr
    assert "done: 5 pages fetched, 1 errors, 1 throttled this run" in stderr, stderr


@pytest.mark.parametrize("processes", [1, 2])
async def test_a_failing_progress_display_stops_alone_and_the_crawl_finishes(
    tmp_path: Path,
    processes: int,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The display's first snapshot fails (the backend cannot be read); a page is held until
    then, so the crawl is still running when the display fails, and then finishes."""
    failed = asyncio.Event()
    real_snapshot = progress.snapshot

    async def snapshot(crawl: Crawl, backend: Backend) -> progress.Snapshot:
        if not failed.is_set():
            failed.set()
            raise BackendError("the queue cannot be read")
        return await real_snapshot(crawl, backend)

    async def held(request: web.Request) -> web.StreamResponse:
        await failed.wait()
        return linked_page(request, 4)

    monkeypatch.setattr(progress, "snapshot", snapshot)
    site = Site(name="site.test", pages=4)
    site.routes = {"/page/1": held}
    async with SyntheticWeb([site]) as net:
        seeds = (net.url("site.test"),)
        # The held page waits for the display's first snapshot, 5 s in: it must not time out.
        fetch = fetch_settings(net, timeouts=Timeouts(connect=5, read=GUARD, total=GUARD))
        crawl = Crawl(crawl_settings(net, tmp_path, fetch=fetch))
        if processes == 1:
            running = cli_crawl._crawl(crawl, seeds, 10, 5.0, True)
        else:
            command = [*seeds, "--out", str(tmp_path), "--resolve-only", "--processes", "2"]
            command += ["--resolve", f"site.test={net.addresses['site.test']}"]
            command += ["--allow-network", "127.0.0.0/8"]
            monkeypatch.setattr(sys, "argv", ["crawlq", "crawl", *command])
            running = cli_crawl._supervise(crawl, seeds, processes, True)
        await asyncio.wait_for(running, GUARD)
    assert "progress display stopped (the crawl goes on)" in caplog.text
    assert "BackendError: the queue cannot be read" in caplog.text
    assert "done: 4 pages fetched, 0 errors, 0 throttled this run" in capsys.readouterr().err


@pytest.mark.parametrize(("level", "xfl"), [("1", 4), ("9", 2)])
async def test_warc_level_is_the_gzip_level_of_every_record(
    tmp_path: Path, level: str, xfl: int
) -> None:
    """gzip's header says which: XFL 4 for the fastest, 2 for the smallest."""
    async with SyntheticWeb([Site(name="site.test", pages=8)]) as net:
        crawl = await run_crawl(net, tmp_path, "--warc-level", level)
        _, err = await asyncio.wait_for(crawl.communicate(), GUARD)
    assert crawl.returncode == 0, err.decode()
    store = WarcStore(tmp_path / WARC_DIR)
    headers = []
    for url in net.page_urls("site.test"):
        (ref,) = store.refs(url)
        with open(tmp_path / WARC_DIR / ref.file, "rb") as file:
            file.seek(ref.offset)
            headers.append(file.read(10))
    await store.aclose()
    assert [(header[:2], header[8]) for header in headers] == [(b"\x1f\x8b", xfl)] * 8


async def test_a_warc_level_gzip_has_not_is_refused(tmp_path: Path) -> None:
    async with SyntheticWeb([Site(name="site.test", pages=1)]) as net:
        crawl = await run_crawl(net, tmp_path, "--warc-level", "10")
        _, err = await asyncio.wait_for(crawl.communicate(), GUARD)
    assert crawl.returncode == 2
    assert "--warc-level" in err.decode() and "0<=x<=9" in err.decode()
    assert not net.hits


@pytest.mark.parametrize("extra", [(), ("--allow-domain", "example.org")])
async def test_a_seed_that_is_not_an_http_url_is_refused_before_out_is_made(
    tmp_path: Path, extra: tuple[str, ...]
) -> None:
    """`crawlq crawl example.org` said "invalid element: URL ..." (an element of what?); with
    --allow-domain it made OUT's pages.jsonl and warc/ first, then said "out_of_scope"."""
    out = tmp_path / "out"
    crawl = await asyncio.create_subprocess_exec(
        *(sys.executable, "-m", "crawlq", "crawl", "example.org", "--out", str(out), *extra),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    _, err = await asyncio.wait_for(crawl.communicate(), GUARD)
    assert crawl.returncode == 2, err
    assert "Invalid value for SEED: 'example.org' is not an absolute http" in err.decode(), err
    assert not out.exists()


def test_crawl_settings_refuse_a_warc_level_gzip_has_not(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="warc_level must be 0 to 9"):
        CrawlSettings(out=tmp_path, warc_level=-1)
