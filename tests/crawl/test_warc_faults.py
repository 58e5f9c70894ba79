"""The WARC writer on a disk that fills up: a failed write or close leaves every file
readable and the writer able to go on once there is room again."""

from __future__ import annotations

import contextlib
import errno
import io
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from warcio.archiveiterator import ArchiveIterator

from crawlq.crawl import warc
from crawlq.crawl.response import Response
from crawlq.crawl.warc import RotatingWarcWriter, read_record

if TYPE_CHECKING:
    from _typeshed import ReadableBuffer


def page(n: int) -> Response:
    body = f"<html><title>page {n}</title>{'x' * 500}</html>".encode()
    return Response(
        url=f"http://site.test/page/{n}",
        status=200,
        reason="OK",
        http_version="HTTP/1.1",
        headers=(("Content-Type", "text/html"),),
        raw=body,
        body=body,
        fetched_at=1_700_000_000.0 + n,
        elapsed=0.01,
    )


class Disk:
    """What the next write or close of a WARC file meets."""

    def __init__(self) -> None:
        self.full = False  # a write stores half its bytes, the next one fails with ENOSPC
        self.room: int | None = None  # how long a file may grow: a write stores what fits
        self.failing_closes = 0  # this many closes fail (after closing the file) with EIO
        self.failing_opens = 0  # this many opens of a new file fail with ENOSPC

    def open(self, path: Path, mode: str, **_: Any) -> DiskFile:
        if self.failing_opens:
            self.failing_opens -= 1
            raise OSError(errno.ENOSPC, "No space left on device")
        return DiskFile(self, path, mode)


class DiskFile(io.FileIO):
    def __init__(self, disk: Disk, path: Path, mode: str) -> None:
        super().__init__(path, mode)
        self.disk = disk
        self.torn = False

    def write(self, data: ReadableBuffer, /) -> int:
        if self.disk.room is not None:
            view = memoryview(data)[: max(self.disk.room - self.tell(), 0)]
            if not view:
                raise OSError(errno.ENOSPC, "No space left on device")
            return super().write(view)
        if not self.disk.full:
            return super().write(data)
        if self.torn:
            raise OSError(errno.ENOSPC, "No space left on device")
        self.torn = True
        view = memoryview(data)
        return super().write(view[: len(view) // 2])

    def close(self) -> None:
        super().close()
        if self.disk.failing_closes:
            self.disk.failing_closes -= 1
            raise OSError(errno.EIO, "Input/output error")


@pytest.fixture
def disk(monkeypatch: pytest.MonkeyPatch) -> Disk:
    disk = Disk()
    monkeypatch.setattr(warc, "open", disk.open, raising=False)
    return disk


def urls_in(path: Path) -> list[str]:
    with open(path, "rb") as file:
        return [
            record.rec_headers.get_header("WARC-Target-URI") or record.rec_type
            for record in ArchiveIterator(file)
        ]


def test_a_failed_write_is_cut_back_off_and_later_records_stay_readable(
    tmp_path: Path, disk: Disk
) -> None:
    writer = RotatingWarcWriter(tmp_path, max_file_bytes=1 << 20)
    first = writer.write(page(1))
    disk.full = True
    with pytest.raises(OSError, match="No space left"):
        writer.write(page(2))
    disk.full = False
    third = writer.write(page(3))
    writer.close()

    assert third.file == first.file
    assert urls_in(tmp_path / first.file) == [
        "warcinfo",
        "http://site.test/page/1",
        "http://site.test/page/3",
    ]
    assert read_record(tmp_path, third).url == "http://site.test/page/3"


def test_a_failed_close_lets_the_next_record_open_a_new_file(tmp_path: Path, disk: Disk) -> None:
    writer = RotatingWarcWriter(tmp_path, max_file_bytes=1)  # every record rotates
    disk.failing_closes = 1
    with pytest.raises(OSError, match="Input/output error"):
        writer.write(page(1))
    second = writer.write(page(2))
    third = writer.write(page(3))
    writer.close()

    assert second.file != third.file
    assert read_record(tmp_path, second).url == "http://site.test/page/2"
    assert urls_in(tmp_path / third.file) == ["warcinfo", "http://site.test/page/3"]


def test_a_failed_write_that_cannot_be_cut_back_moves_on_to_a_new_file(
    tmp_path: Path, disk: Disk, monkeypatch: pytest.MonkeyPatch
) -> None:
    def cannot_truncate(fd: int, length: int) -> None:
        raise OSError(errno.EIO, "Input/output error")

    writer = RotatingWarcWriter(tmp_path, max_file_bytes=1 << 20)
    first = writer.write(page(1))
    disk.full = True
    with monkeypatch.context() as patch:
        patch.setattr(os, "ftruncate", cannot_truncate)
        with pytest.raises(OSError, match="cannot cut back"):
            writer.write(page(2))
    disk.full = False
    third = writer.write(page(3))
    writer.close()

    assert third.file != first.file
    assert urls_in(tmp_path / third.file) == ["warcinfo", "http://site.test/page/3"]
    assert read_record(tmp_path, first).url == "http://site.test/page/1"


def test_a_batch_the_disk_has_no_room_for_keeps_the_records_that_fit(
    tmp_path: Path, disk: Disk
) -> None:
    writer = RotatingWarcWriter(tmp_path, max_file_bytes=1 << 20)
    first = writer.write(page(1))
    disk.room = first.offset + first.length * 7 // 2  # two more records and half of a third
    refs = writer.write_many([page(2), page(3), page(4)])
    disk.room = None
    fifth = writer.write(page(5))
    writer.close()

    assert [type(ref) for ref in refs] == [warc.RecordRef, warc.RecordRef, OSError]
    assert urls_in(tmp_path / first.file) == [
        "warcinfo",
        *(f"http://site.test/page/{n}" for n in (1, 2, 3, 5)),
    ]
    written = [ref for ref in refs if isinstance(ref, warc.RecordRef)]
    assert [read_record(tmp_path, ref).url for ref in (*written, fifth)] == [
        "http://site.test/page/2",
        "http://site.test/page/3",
        "http://site.test/page/5",
    ]


def test_a_batch_rotates_files_where_records_alone_would(tmp_path: Path) -> None:
    probe = RotatingWarcWriter(tmp_path / "probe", max_file_bytes=1 << 20)
    size = probe.write(page(0)).length
    probe.close()
    alone = RotatingWarcWriter(tmp_path / "alone", max_file_bytes=3 * size)
    batched = RotatingWarcWriter(tmp_path / "batched", max_file_bytes=3 * size)
    one_by_one = [alone.write(page(n)) for n in range(7)]
    together = batched.write_many([page(n) for n in range(7)])
    alone.close()
    batched.close()

    def files(directory: Path) -> list[list[str]]:
        return [urls_in(path) for path in sorted(directory.glob("*.warc.gz"))]

    assert len(files(tmp_path / "alone")) == 3
    assert files(tmp_path / "batched") == files(tmp_path / "alone")
    # Files are named <prefix>-<run>-<n>.warc.gz: the two writers' runs may differ.
    assert [ref.file[-13:] for ref in together if isinstance(ref, warc.RecordRef)] == [
        ref.file[-13:] for ref in one_by_one
    ]
    for n, ref in enumerate(together):
        assert isinstance(ref, warc.RecordRef)
        assert read_record(tmp_path / "batched", ref).url == f"http://site.test/page/{n}"


def test_a_batch_that_cannot_open_its_next_file_keeps_the_records_before_it(
    tmp_path: Path, disk: Disk
) -> None:
    probe = RotatingWarcWriter(tmp_path / "probe", max_file_bytes=1 << 20)
    size = probe.write(page(0)).length
    probe.close()
    writer = RotatingWarcWriter(tmp_path / "warc", max_file_bytes=size * 5 // 2)
    first = writer.write(page(1))
    disk.failing_opens = 1  # the second file: page 3 finds no room, page 4 opens it
    refs = writer.write_many([page(2), page(3), page(4)])
    writer.close()

    assert [type(ref) for ref in refs] == [warc.RecordRef, OSError, warc.RecordRef]
    written = [ref for ref in (first, *refs) if isinstance(ref, warc.RecordRef)]
    assert [read_record(tmp_path / "warc", ref).url[-6:] for ref in written] == [
        "page/1",
        "page/2",
        "page/4",
    ]
    assert written[1].file == first.file != written[2].file


def test_a_torn_batch_keeps_the_records_written_whole_and_writes_none_twice(
    tmp_path: Path, disk: Disk, monkeypatch: pytest.MonkeyPatch
) -> None:
    def cannot_truncate(fd: int, length: int) -> None:
        raise OSError(errno.EIO, "Input/output error")

    writer = RotatingWarcWriter(tmp_path, max_file_bytes=1 << 20)
    first = writer.write(page(0))
    disk.room = first.offset + first.length * 3  # the batch tears inside its third record
    with monkeypatch.context() as patch:
        patch.setattr(os, "ftruncate", cannot_truncate)
        refs = writer.write_many([page(n) for n in range(1, 5)])
    disk.room = None
    writer.close()

    assert all(isinstance(ref, warc.RecordRef) for ref in refs)
    whole = [ref for ref in refs if isinstance(ref, warc.RecordRef)]
    assert [read_record(tmp_path, ref).url[-6:] for ref in whole] == [
        f"page/{n}" for n in range(1, 5)
    ]
    # Pages 1 and 2 were written whole before the tear: they stay there; 3 and 4 go again.
    assert [ref.file == first.file for ref in whole] == [True, True, False, False]
    ids = []
    for path in sorted(tmp_path.glob("*.warc.gz")):
        # The torn file ends in part of page 3's record: read up to it.
        with open(path, "rb") as file, contextlib.suppress(Exception):
            for record in ArchiveIterator(file):
                ids.append(record.rec_headers.get_header("WARC-Record-ID"))
    assert len(ids) == 1 + 3 + 1 + 2  # two warcinfo records, pages 0 to 4
    assert len(ids) == len(set(ids))
