"""`crawlq crawl` SIGKILLed at chosen points, then run again: every page the queue had done
at the kill has its response in the WARC files, indexed, and read back whole, and its line in
pages.jsonl; what a kill in the middle of a write leaves (a torn record, part of a line) takes
nothing with it; a disk that fills up stops the crawl with its pages queued.

Points are chosen by what the test holds (pages the server has not answered, the WARC index's
write lock), never by sleeping; conditions are polled with a deadline."""

from __future__ import annotations

import asyncio
import gzip
import resource
import signal
from collections import Counter
from collections.abc import Awaitable, Callable, Iterator
from contextlib import closing, contextmanager
from pathlib import Path
from urllib.parse import urlsplit

from aiohttp import web

from crawlq.backends import open_backend
from crawlq.crawl.crawler import PAGES_FILE, WARC_DIR
from crawlq.crawl.records import read_records
from crawlq.crawl.store import INDEX_FILE, open_index
from crawlq.crawl.testing import Site, SyntheticWeb
from crawlq.crawl.testing.sites import page_html
from crawlq.crawl.warc import RecordRef, read_record
from crawlq.crawl.warc_check import check
from crawlq.types import QueueStats

from .test_cli_crawl import GUARD, PAGES, Gate, finish, run_crawl

QUEUE = "crawl"


async def until(condition: Callable[[], Awaitable[bool]], what: str) -> None:
    async with asyncio.timeout(GUARD):
        while not await condition():
            await asyncio.sleep(0.02)
    assert await condition(), what


async def done_in_queue(out: Path, urls: set[str]) -> set[str]:
    """Those of `urls` (pages the server answered) the queue holds no more: acknowledged."""
    backend = open_backend(f"sqlite:///{out / 'queue.db'}", create=False)
    await backend.open()
    try:
        return {url for url in urls if await backend.element(QUEUE, url) is None}
    finally:
        await backend.close()


def index_rows(out: Path) -> list[tuple[str, RecordRef]]:
    with closing(open_index(out / WARC_DIR / INDEX_FILE)) as index:
        rows = index.execute("SELECT url, file, offset, length FROM responses ORDER BY id")
        return [(url, RecordRef(file=f, offset=o, length=n)) for url, f, o, n in rows]


def check_outputs(out: Path, urls: set[str]) -> dict[str, list[RecordRef]]:
    """Each of `urls` indexed, each index row read back whole as its page, each page with a
    200 line in pages.jsonl naming an indexed record of it; the refs by URL."""
    refs: dict[str, list[RecordRef]] = {}
    for url, ref in index_rows(out):
        stored = read_record(out / WARC_DIR, ref)
        assert (stored.url, stored.status) == (url, 200)
        assert f"page {url.rsplit('/', 1)[1]}</title>" in stored.text()
        refs.setdefault(url, []).append(ref)
    assert urls <= set(refs)
    lines: dict[str, list[str]] = {}
    for record in read_records(out / PAGES_FILE):
        if record["status"] == 200:
            lines.setdefault(str(record["url"]), []).append(str(record["warc"]))
    for url in urls:
        assert lines.get(url), f"no line for {url}"
        indexed = {f"{ref.file}:{ref.offset}" for ref in refs[url]}
        assert set(lines[url]) & indexed, (url, lines[url], indexed)
    return refs


class Answers:
    """Pages answer at once until `after` were answered, later ones wait for `release`; the
    URLs answered so far."""

    def __init__(self, after: int) -> None:
        self.gate = Gate(after)
        self.answered: set[str] = set()

    async def page(self, request: web.Request) -> web.StreamResponse:
        response = await self.gate.page(request)
        self.answered.add(str(request.url))
        return response


async def test_a_kill_keeps_every_done_page_whole_and_a_torn_tail_takes_nothing_with_it(
    tmp_path: Path,
) -> None:
    answers = Answers(after=8)
    site = Site(name="site.test", pages=PAGES)
    site.routes = {f"/page/{n}": answers.page for n in range(PAGES)}
    async with SyntheticWeb([site]) as net:
        # Files of about three records: offsets on both sides of rotations, across the kill.
        first = await run_crawl(net, tmp_path, "--lease", "4", "--warc-size", "1000")
        await asyncio.wait_for(answers.gate.reached.wait(), GUARD)

        async def answered_all_done() -> bool:
            return await done_in_queue(tmp_path, answers.answered) == answers.answered

        await until(answered_all_done, "the pages answered to be done in the queue")
        first.kill()
        await finish(first)
        done = await done_in_queue(tmp_path, answers.answered)
        assert len(done) == 8

        before = check_outputs(tmp_path, done)
        # What a kill in the middle of writes leaves: the end of a record, part of a line.
        *rotated, killed = sorted((tmp_path / WARC_DIR).glob("*.warc.gz"))
        assert rotated
        member = gzip.compress(b"WARC/1.0\r\nWARC-Type: response\r\n" + b"x" * 4000)
        with open(killed, "ab") as file:
            file.write(member[: len(member) // 2])
        torn = killed.read_bytes()
        with open(tmp_path / PAGES_FILE, "ab") as file:
            file.write(b'{"url":"http://site.test/page/9","ti')

        answers.gate.after = PAGES * 10
        answers.gate.release.set()
        second = await run_crawl(net, tmp_path, "--lease", "4", "--warc-size", "1000")
        stderr = await finish(second)
        assert second.returncode == 0, stderr
        assert "0 left in the queue" in stderr

    after = check_outputs(tmp_path, set(net.page_urls("site.test")))
    assert killed.read_bytes() == torn  # written by no one again
    fetched = Counter(h.path for h in net.hits if h.path.startswith("/page/"))
    for url in done:  # done: never fetched, stored or recorded again
        assert fetched[urlsplit(url).path] == 1
        assert after[url] == before[url]
    lines = Counter(str(r["url"]) for r in read_records(tmp_path / PAGES_FILE))
    assert all(lines[url] == 1 for url in done), lines
    # `crawlq warc check` finds the torn tail, and nothing else amiss; --repair cuts it off.
    report = check(tmp_path / WARC_DIR)
    assert [f.name for f in report.torn] == [killed.name]
    assert not (report.unindexed or report.stale or report.damaged)
    assert check(tmp_path / WARC_DIR, repair=True).repaired
    assert check(tmp_path / WARC_DIR).clean
    assert killed.read_bytes() == torn[: report.torn[0].torn_at]


@contextmanager
def index_locked(out: Path) -> Iterator[None]:
    """Holds the WARC index's write lock: a crawl's sync puts its records on disk, then waits
    to index them (for up to 30 s), so its pages are never done meanwhile."""
    (out / WARC_DIR).mkdir(parents=True)
    with closing(open_index(out / WARC_DIR / INDEX_FILE)) as index:
        index.execute("BEGIN IMMEDIATE")
        try:
            yield
        finally:
            index.execute("ROLLBACK")


def responses_written(out: Path) -> int:
    """Response records in the WARC files, whole ones (the last may be in the middle of its
    write, as the crawl goes on)."""
    count = 0
    for path in (out / WARC_DIR).glob("*.warc.gz"):
        data = path.read_bytes()
        while data:
            try:
                text = gzip.decompress(data)
            except (EOFError, OSError):
                data = data[:-1]  # the part a write in progress left: cut, try the rest
                continue
            count += text.count(b"WARC-Type: response\r\n")
            break
    return count


async def test_a_kill_after_the_records_are_written_before_they_are_indexed(
    tmp_path: Path,
) -> None:
    async with SyntheticWeb([Site(name="site.test", pages=PAGES)]) as net:
        with index_locked(tmp_path):
            first = await run_crawl(net, tmp_path, "--lease", "4")

            async def written() -> bool:
                return responses_written(tmp_path) >= 1

            await until(written, "records written")
            first.kill()
            await finish(first)
        answered = {f"http://site.test:{net.ports['site.test']}{h.path}" for h in net.hits}
        assert await done_in_queue(tmp_path, answered & set(net.page_urls("site.test"))) == set()
        assert index_rows(tmp_path) == []  # the records of the killed run: in no index

        second = await run_crawl(net, tmp_path, "--lease", "4")
        stderr = await finish(second)
        assert second.returncode == 0, stderr

    refs = check_outputs(tmp_path, set(net.page_urls("site.test")))
    assert all(len(found) == 1 for found in refs.values()), refs
    # At least once: a page the killed run had recorded, not done, may have a line of each
    # run, told apart by their attempts (the second run's is the last).
    attempts: dict[str, list[int]] = {}
    for record in read_records(tmp_path / PAGES_FILE):
        attempts.setdefault(str(record["url"]), []).append(int(str(record["attempt"])))
    assert all(tries in ([1], [2], [1, 2]) for tries in attempts.values()), attempts


def full_disk_at(size: int) -> Callable[[], None]:
    """Set in a child process: it cannot grow a file past `size` bytes (EFBIG, as a full disk
    refuses writes), nor is it killed for trying (SIGXFSZ)."""

    def limit() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (size, size))

    return limit


async def big_page(request: web.Request) -> web.StreamResponse:
    number = int(request.path.rsplit("/", 1)[1])
    links = [f"/page/{n}" for n in (number + 1, 2 * number + 1, 2 * number + 2) if n < PAGES]
    html = page_html(f"page {number}", links, body="x" * 400_000)
    return web.Response(text=html, content_type="text/html")


async def test_a_full_disk_stops_the_crawl_with_a_clear_error_and_its_pages_queued(
    tmp_path: Path,
) -> None:
    site = Site(name="site.test", pages=PAGES)
    site.routes = {f"/page/{n}": big_page for n in range(PAGES)}
    async with SyntheticWeb([site]) as net:
        # The WARC file, 400 KB a record, reaches the limit long before the queue's files do
        # (a full disk stops their writes too: the elements then wait for their leases).
        limit = full_disk_at(2 << 20)
        first = await run_crawl(
            net, tmp_path, "--warc-level", "0", "--lease", "4", preexec_fn=limit
        )
        stderr = await finish(first)
        assert first.returncode == 1, stderr
        assert "Error: the crawl stopped: its outputs could not be written" in stderr
        assert "File too large" in stderr and "run the same command again" in stderr
        (queue,) = await queue_stats(tmp_path)
        assert queue.total > 0 and queue.dead == 0

        second = await run_crawl(net, tmp_path, "--warc-level", "0", "--lease", "4")
        stderr = await finish(second)
        assert second.returncode == 0, stderr
        assert "0 left in the queue" in stderr
    check_outputs(tmp_path, set(net.page_urls("site.test")))


async def queue_stats(out: Path) -> list[QueueStats]:
    backend = open_backend(f"sqlite:///{out / 'queue.db'}", create=False)
    await backend.open()
    try:
        return await backend.queue_stats([QUEUE])
    finally:
        await backend.close()


async def test_an_output_folder_that_cannot_be_written_is_refused_before_any_page(
    tmp_path: Path,
) -> None:
    (tmp_path / WARC_DIR).write_text("not a folder")
    async with SyntheticWeb([Site(name="site.test", pages=PAGES)]) as net:
        process = await run_crawl(net, tmp_path)
        stderr = await finish(process)
    assert process.returncode == 1, stderr
    assert f"--out '{tmp_path}': cannot write in the folder: {tmp_path / WARC_DIR}: File" in stderr
    assert net.hits == []
