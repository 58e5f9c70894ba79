"""What a kill leaves behind, read back: a record is returned whole or not at all (a cut-off
one raises UnreadableRecord, never a shorter body), and a crawl killed mid-way and run again
keeps every acknowledged page's record in the WARC files, their index and pages.jsonl."""

from __future__ import annotations

import errno
import os
import sqlite3
import time
from dataclasses import replace
from functools import partial
from pathlib import Path

import pytest

from crawlq.crawl import store as store_module
from crawlq.crawl import warc
from crawlq.crawl.crawler import PAGES_FILE, Crawl
from crawlq.crawl.records import JsonlWriter, PageRecord, read_records
from crawlq.crawl.store import WarcStore, open_index
from crawlq.crawl.testing import Site, SyntheticWeb
from crawlq.crawl.warc import (
    RecordRef,
    Rendition,
    RotatingWarcWriter,
    UnreadableRecord,
    read_record,
    read_rendition,
)

from .conftest import crawl_settings
from .test_warc_faults import page


def written(directory: Path, count: int) -> list[RecordRef]:
    writer = RotatingWarcWriter(directory, max_file_bytes=1 << 20)
    refs = [writer.write(page(n)) for n in range(count)]
    writer.close()
    return refs


@pytest.fixture
def one_second(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every writer of the test starts in the same second (as the process's pid, its own)."""
    second = time.gmtime()
    monkeypatch.setattr(time, "gmtime", lambda *_: second)


def test_two_writers_of_one_process_and_second_keep_to_files_of_their_own(
    tmp_path: Path, one_second: None
) -> None:
    """Two stores of one folder in one process (one per event loop) started in one second
    took the same file name: each appended to it with offsets of its own."""
    first = RotatingWarcWriter(tmp_path, max_file_bytes=1 << 20)
    second = RotatingWarcWriter(tmp_path, max_file_bytes=1 << 20)
    refs = [first.write(page(0)), second.write(page(1)), first.write(page(2))]
    first.close()
    second.close()

    assert len({ref.file for ref in refs}) == 2
    assert [read_record(tmp_path, ref).url for ref in refs] == [page(n).url for n in range(3)]


def test_a_run_of_the_same_pid_and_second_leaves_a_killed_one_s_file_as_it_was(
    tmp_path: Path, one_second: None
) -> None:
    """A crawl restarted at once in a container has the pid the killed one had: the torn file
    that one left is not appended to (its torn end would sit in the middle of the file)."""
    (torn,) = written(tmp_path, 1)
    path = tmp_path / torn.file
    path.write_bytes(path.read_bytes()[:-30])
    left = path.read_bytes()

    (ref,) = written(tmp_path, 1)

    assert ref.file != torn.file
    assert path.read_bytes() == left
    assert read_record(tmp_path, ref).url == page(0).url


def test_a_record_cut_off_by_a_kill_is_refused_not_read_short(tmp_path: Path) -> None:
    *whole, last = written(tmp_path, 3)
    path = tmp_path / last.file
    with open(path, "r+b") as file:
        file.truncate(last.offset + last.length - 30)  # as a kill in the middle of its write

    assert [read_record(tmp_path, ref).raw for ref in whole] == [page(0).raw, page(1).raw]
    with pytest.raises(UnreadableRecord, match=f"{path} at {last.offset}: cut off"):
        read_record(tmp_path, last)


def test_a_record_damaged_inside_is_refused(tmp_path: Path) -> None:
    _, ref = written(tmp_path, 2)
    path = tmp_path / ref.file
    data = bytearray(path.read_bytes())
    data[ref.offset + ref.length - 5] ^= 0xFF  # its gzip trailer's CRC
    path.write_bytes(bytes(data))
    with pytest.raises(UnreadableRecord, match=r"not a whole gzip member: .*incorrect data check"):
        read_record(tmp_path, ref)


def test_reading_where_no_record_is_says_what_is_wrong(tmp_path: Path) -> None:
    (ref,) = written(tmp_path, 1)
    with pytest.raises(UnreadableRecord, match=r"missing\.warc\.gz at 0: No such file"):
        read_record(tmp_path, RecordRef(file="missing.warc.gz", offset=0, length=10))
    with pytest.raises(
        UnreadableRecord, match=r"not a whole gzip member: .*incorrect header check"
    ):
        read_record(tmp_path, RecordRef(file=ref.file, offset=ref.offset + 1, length=10))
    with pytest.raises(UnreadableRecord, match="the file ends 0 of its"):
        read_record(tmp_path, RecordRef(file=ref.file, offset=1 << 20, length=ref.length))
    with pytest.raises(UnreadableRecord, match="a response record, not a conversion record"):
        read_rendition(tmp_path, ref)
    info = RecordRef(file=ref.file, offset=0, length=ref.offset)
    with pytest.raises(UnreadableRecord, match="a warcinfo record, not a response record"):
        read_record(tmp_path, info)


def test_records_on_both_sides_of_a_rotation_read_back(tmp_path: Path) -> None:
    writer = RotatingWarcWriter(tmp_path, max_file_bytes=1500)
    rendition = Rendition(url=page(0).url, final_url=page(0).url, html="<p>é</p>", fetched_at=1.0)
    refs = [writer.write(page(n)) for n in range(6)]
    drawn = writer.write(rendition)
    writer.close()

    assert len({ref.file for ref in refs}) > 1
    assert [read_record(tmp_path, ref).raw for ref in refs] == [page(n).raw for n in range(6)]
    assert read_rendition(tmp_path, drawn) == rendition


def page_record(n: int, title: str = "page") -> PageRecord:
    return PageRecord(url=f"http://site.test/page/{n}", depth=0, attempt=1, status=200, title=title)


def write_lines(path: Path, *records: PageRecord) -> None:
    writer = JsonlWriter(path)
    try:
        for record in records:
            writer.write(record)
    finally:
        writer.close()


def test_the_line_a_killed_process_left_unfinished_does_not_take_the_next_run_s_first(
    tmp_path: Path,
) -> None:
    path = tmp_path / "pages.jsonl"
    write_lines(path, page_record(1))
    with open(path, "ab") as file:  # as a kill in the middle of the write of page 2's line
        file.write(page_record(2).to_json().encode()[:20])

    write_lines(path, page_record(3))  # the crawl run again
    write_lines(path, page_record(4))

    assert [r["url"] for r in read_records(path)] == [page_record(n).url for n in (1, 3, 4)]
    lines = path.read_bytes().splitlines()
    assert len(lines) == 4  # the part, on a line of its own; no empty line


def test_a_line_cut_in_the_middle_of_a_character_is_skipped(tmp_path: Path) -> None:
    path = tmp_path / "pages.jsonl"
    write_lines(path, page_record(1, "café"))
    line = page_record(2, "é" * 8).to_json().encode()
    with open(path, "ab") as file:
        file.write(line[: line.index("é".encode()) + 1])

    write_lines(path, page_record(3, "naïve"))

    assert [(r["url"], r["title"]) for r in read_records(path)] == [
        (page_record(1).url, "café"),
        (page_record(3).url, "naïve"),
    ]


async def test_an_index_the_disk_has_no_room_for_fails_the_sync_with_the_disk_s_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SQLite ends a transaction itself when the disk is full: the store's ROLLBACK then
    failed ("no transaction is active") and hid why. The rows wait for a sync with room."""
    opened: list[sqlite3.Connection] = []

    def full_index(path: Path) -> sqlite3.Connection:
        connection = open_index(path)
        (pages,) = connection.execute("PRAGMA page_count").fetchone()
        connection.execute(f"PRAGMA max_page_count = {pages}")  # as a full disk
        opened.append(connection)
        return connection

    monkeypatch.setattr(store_module, "open_index", full_index)
    # the test makes room on the index's connection, from its own thread
    monkeypatch.setattr(sqlite3, "connect", partial(sqlite3.connect, check_same_thread=False))
    long = replace(page(1), url=page(1).url + "?q=" + "x" * 5000)  # a page of the index its own
    store = WarcStore(tmp_path)
    try:
        ref = await store.put(long)
        with pytest.raises(sqlite3.OperationalError, match="database or disk is full"):
            await store.sync()
        opened[0].execute("PRAGMA max_page_count = 1000000")  # room again
        await store.sync()
    finally:
        await store.aclose()
    assert store.refs(long.url) == [ref]


def read_only(path: Path, *_: object, **__: object) -> None:
    raise OSError(errno.EROFS, "Read-only file system", str(path))


async def test_a_crawl_whose_warc_folder_refuses_writes_stops_with_its_pages_queued(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each page failed on its own and was retried into the dead letters: the crawl ended
    "done" with every page dead. A disk that refuses a record stops the worker instead."""
    monkeypatch.setattr(warc, "open", read_only, raising=False)
    async with SyntheticWeb([Site(name="a.test", pages=5)]) as net:
        crawl = Crawl(crawl_settings(net, tmp_path))
        stats = await crawl.run([net.url("a.test")], concurrency=1)
        backend = await crawl.app.backend()
        (queue,) = await backend.queue_stats([crawl.task.name])
        await crawl.app.aclose()
    assert (stats.done, stats.dead, queue.dead) == (0, 0, 0)
    assert queue.total == 1  # the seed, to run again once the folder takes writes


async def test_a_crawl_whose_page_records_cannot_be_written_stops_with_its_pages_queued(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real_write = os.write
    pages = tmp_path / PAGES_FILE

    def full_disk(fd: int, data: bytes) -> int:
        if os.path.samestat(os.fstat(fd), pages.stat()):
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_write(fd, data)

    async with SyntheticWeb([Site(name="a.test", pages=5)]) as net:
        crawl = Crawl(crawl_settings(net, tmp_path))
        pages.touch()
        monkeypatch.setattr(os, "write", full_disk)
        stats = await crawl.run([net.url("a.test")], concurrency=1)
        monkeypatch.undo()
        backend = await crawl.app.backend()
        (queue,) = await backend.queue_stats([crawl.task.name])
        await crawl.app.aclose()
    assert (stats.done, stats.dead, queue.dead) == (0, 0, 0)
    assert queue.total >= 1  # the seed (and the links it found), to run again
