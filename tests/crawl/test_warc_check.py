"""`crawlq warc check`: WARC files read against their index. A real crawl's outputs check
clean; a lost index is rebuilt to give every URL the record it gave before; torn tails,
rows into them and damage in the middle are found and (but damage) repaired; a file a live
writer holds is not judged, and repair waits for the writer to be gone."""

from __future__ import annotations

import gzip
import sqlite3
import subprocess
import sys
from contextlib import closing
from dataclasses import replace
from pathlib import Path

import pytest
from warcio.archiveiterator import ArchiveIterator

from crawlq.crawl.crawler import WARC_DIR, Crawl
from crawlq.crawl.store import INDEX_FILE, WarcStore, open_index
from crawlq.crawl.testing import Site, SyntheticWeb
from crawlq.crawl.warc import RecordRef, Rendition, RotatingWarcWriter, read_record
from crawlq.crawl.warc_check import check, compare, scan_file
from crawlq.errors import ConfigError

from .conftest import crawl_settings
from .test_warc_faults import page

URLS = 6  # pages 0..5, each stored twice (an older and a newer fetch)


async def stored(directory: Path, *, file_bytes: int = 4_000) -> list[RecordRef]:
    """A store of URLS pages fetched twice each and one rendition, in files of a few records."""
    store = WarcStore(directory, max_file_bytes=file_bytes)
    refs = []
    for round_ in range(2):
        for n in range(URLS):
            fetched = replace(page(n), fetched_at=page(n).fetched_at + 1_000 * round_)
            refs.append(await store.put(fetched))
    rendition = Rendition(
        url=page(0).url, final_url=page(0).url + "#x", html="<p>dom</p>", fetched_at=1.8e9
    )
    refs.append(await store.put_rendition(rendition))
    await store.aclose()
    return refs


async def latest(directory: Path) -> dict[str, tuple[bytes, float] | None]:
    store = WarcStore(directory)
    try:
        found: dict[str, tuple[bytes, float] | None] = {}
        for n in range(URLS):
            response = await store.get(page(n).url)
            found[page(n).url] = None if response is None else (response.raw, response.fetched_at)
        rendition = await store.get_rendition(page(0).url)
        found["rendition"] = None if rendition is None else (rendition.body, rendition.fetched_at)
        return found
    finally:
        await store.aclose()


def index_rows(directory: Path) -> int:
    with closing(sqlite3.connect(directory / INDEX_FILE)) as index:
        return sum(index.execute(f"SELECT count(*) FROM {t}").fetchone()[0] for t in TABLES)


TABLES = ("responses", "renditions")


def crawlq_warc_check(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "crawlq", "warc", "check", *args],
        capture_output=True,
        text=True,
        timeout=120,
    )


async def test_a_real_crawls_files_and_index_check_clean(tmp_path: Path) -> None:
    """The scanner finds every record exactly where the writer indexed it (offsets and
    lengths across rotations), and a check writes nothing."""
    async with SyntheticWeb([Site(name="a.test", pages=30)]) as net:
        settings = replace(crawl_settings(net, tmp_path), max_file_bytes=3_000)
        await Crawl(settings).run([net.url("a.test")], concurrency=8)
    warc = tmp_path / WARC_DIR
    files = sorted(warc.glob("*.warc.gz"))
    assert len(files) > 3
    before = {p: p.read_bytes() for p in files}

    report = check(warc)

    assert report.clean and not report.damaged
    assert report.records == index_rows(warc) >= 30
    assert {p: p.read_bytes() for p in files} == before
    result = crawlq_warc_check(str(tmp_path))  # the crawl's --out: its warc/ is found
    assert result.returncode == 0, result.stderr
    assert "every record indexed, every row a whole record, every file whole" in result.stdout


async def test_a_lost_index_is_rebuilt_to_give_each_url_what_it_gave_before(
    tmp_path: Path,
) -> None:
    await stored(tmp_path)
    before = await latest(tmp_path)
    rows = index_rows(tmp_path)
    for suffix in ("", "-wal", "-shm"):
        Path(f"{tmp_path / INDEX_FILE}{suffix}").unlink(missing_ok=True)

    result = crawlq_warc_check(str(tmp_path))
    assert result.returncode == 1
    assert f"index: {rows} records not indexed" in result.stdout
    assert f"to repair (crawlq warc check --repair): index {rows} records" in result.stdout
    assert not (tmp_path / INDEX_FILE).exists()  # a check alone writes nothing

    result = crawlq_warc_check(str(tmp_path), "--repair")
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"repaired: indexed {rows} records" in result.stdout
    assert index_rows(tmp_path) == rows
    assert await latest(tmp_path) == before
    assert all(value is not None for value in before.values())
    assert check(tmp_path).clean


async def test_a_torn_tail_and_the_rows_into_it_are_cut_and_dropped(tmp_path: Path) -> None:
    """A writer killed mid-record leaves part of a gzip member at its file's end; a row that
    leads into it (indexed, then the file was cut by a bad disk) reads as UnreadableRecord.
    Repair cuts the tail off, drops the row, and the URL gives its older record."""
    refs = await stored(tmp_path, file_bytes=1 << 20)  # one file
    newest = refs[URLS + 3]  # page 3's newer record
    path = tmp_path / newest.file
    whole = path.read_bytes()
    expected = await latest(tmp_path)
    path.write_bytes(whole[: newest.offset + newest.length // 2])
    older = read_record(tmp_path, refs[3])

    report = check(tmp_path)
    assert [f.torn_at for f in report.files] == [newest.offset]
    cut_off = {ref.offset for ref in refs if ref.offset >= newest.offset}
    assert len(cut_off) == 4  # pages 3, 4 and 5's newer records, and the rendition
    assert {r.offset for r in report.stale} == cut_off
    assert all("cut off" in r.why for r in report.stale)
    assert not report.unindexed

    result = crawlq_warc_check(str(tmp_path), "--repair")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "repaired: dropped 4 rows, cut 1 torn tails" in result.stdout
    assert path.read_bytes() == whole[: newest.offset]
    with open(path, "rb") as file:  # a sequential reader reads the file to its end
        assert sum(1 for _ in ArchiveIterator(file)) == 1 + URLS + 3
    after = await latest(tmp_path)
    assert after[page(3).url] == (older.raw, older.fetched_at)
    assert after[page(0).url] == expected[page(0).url]
    assert after["rendition"] is None
    assert check(tmp_path).clean


async def test_damage_in_the_middle_is_skipped_and_what_follows_is_still_found(
    tmp_path: Path,
) -> None:
    refs = await stored(tmp_path, file_bytes=1 << 20)
    hit = refs[URLS + 1]  # page 1's newer record, in the middle of the file
    path = tmp_path / hit.file
    data = bytearray(path.read_bytes())
    data[hit.offset + 20 : hit.offset + 60] = b"\xff" * 40  # no deflate block starts so
    path.write_bytes(bytes(data))

    report = check(tmp_path)
    (scan,) = report.files
    assert scan.torn_at is None
    ((start, end, _),) = scan.damage
    assert start == hit.offset and end == hit.offset + hit.length
    assert [r.offset for r in report.stale] == [hit.offset]
    assert len(scan.records) == len(refs) - 1  # every other record, after the damage too

    result = crawlq_warc_check(str(tmp_path), "--repair")
    assert result.returncode == 1  # repaired, but the damaged record is lost: said so
    assert "damaged: bytes" in result.stdout and "repaired: dropped 1 rows" in result.stdout
    older = read_record(tmp_path, refs[1])
    assert (await latest(tmp_path))[page(1).url] == (older.raw, older.fetched_at)


async def test_a_file_a_live_writer_holds_is_not_judged_nor_repaired(tmp_path: Path) -> None:
    await stored(tmp_path)
    before = set(tmp_path.glob("*.warc.gz"))
    writer = RotatingWarcWriter(tmp_path, max_file_bytes=1 << 20)
    writer.write(page(9))  # written, not yet indexed: the writer's store syncs later
    (live,) = set(tmp_path.glob("*.warc.gz")) - before
    with open(live, "ab") as file:
        file.write(b"\x1f\x8b\x08\x00")  # as if a record were being written right now
    held = live.read_bytes()
    try:
        report = check(tmp_path)
        assert [f.name for f in report.files if f.in_use] == [live.name]
        assert report.clean
        with pytest.raises(ConfigError, match="a crawl is writing here"):
            check(tmp_path, repair=True)
        assert live.read_bytes() == held
    finally:
        writer.close()
    report = check(tmp_path)
    assert [r.url for _, r in report.unindexed] == [page(9).url]
    assert [f.name for f in report.torn] == [live.name]


async def test_crawlq_warc_get_writes_the_latest_body_as_the_server_meant_it(
    tmp_path: Path,
) -> None:
    await stored(tmp_path)
    html = "<html><title>été</title></html>".encode("latin-1")
    zipped = replace(
        page(1),
        headers=(("Content-Type", "text/html; charset=latin-1"), ("Content-Encoding", "gzip")),
        raw=gzip.compress(html),
        body=html,
        fetched_at=1.9e9,
    )
    store = WarcStore(tmp_path)
    await store.put(zipped)
    await store.aclose()

    def get(*args: str) -> subprocess.CompletedProcess[bytes]:
        command = [sys.executable, "-m", "crawlq", "warc", "get", str(tmp_path), *args]
        return subprocess.run(command, capture_output=True, timeout=120)

    assert get(page(1).url).stdout == html  # the newest record, gzip undone
    assert get(page(2).url).stdout == page(2).raw
    head = get(page(1).url, "--head")
    assert head.returncode == 0
    assert head.stdout.decode().splitlines() == [
        f"200 {page(1).url}",
        "fetched at 2030-03-17T17:46:40+00:00",
        "Content-Type: text/html; charset=latin-1",
        "Content-Encoding: gzip",
    ]
    missing = get("http://site.test/never")
    assert missing.returncode == 1
    assert b"no stored response for http://site.test/never" in missing.stderr


async def test_rows_of_a_file_made_after_the_scan_began_are_not_stale(tmp_path: Path) -> None:
    """A running crawl made a file and indexed it between the scan and the index read."""
    await stored(tmp_path, file_bytes=1 << 20)
    scanned = [scan_file(path) for path in sorted(tmp_path.glob("*.warc.gz"))]
    await stored(tmp_path, file_bytes=1 << 20)  # its own new file, indexed
    assert len(list(tmp_path.glob("*.warc.gz"))) == 2

    with closing(open_index(tmp_path / INDEX_FILE)) as index:
        report = compare(tmp_path, scanned, index)

    assert not report.stale and not report.unindexed
