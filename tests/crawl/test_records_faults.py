"""Page records on a nearly full disk: a line is written whole, or the write raises and the
next record still gets a line of its own."""

from __future__ import annotations

import errno
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from crawlq.crawl.records import JsonlWriter, PageRecord, read_records

if TYPE_CHECKING:
    from _typeshed import ReadableBuffer

Write = Callable[[int, "ReadableBuffer"], int]


def record(n: int) -> PageRecord:
    return PageRecord(url=f"http://site.test/page/{n}", depth=1, attempt=1, status=200)


def prefix_then(path: Path, rest: Write) -> Write:
    """An os.write that, to `path`, stores only the first half of its first call's bytes
    (what a nearly full disk does), then does what `rest` does. Other files are untouched."""
    real_write = os.write
    target = path.stat()
    calls = 0

    def write(fd: int, data: ReadableBuffer) -> int:
        nonlocal calls
        if not os.path.samestat(os.fstat(fd), target):
            return real_write(fd, data)
        calls += 1
        if calls > 1:
            return rest(fd, data)
        view = memoryview(data)
        return real_write(fd, view[: len(view) // 2])

    return write


def disk_full(fd: int, data: ReadableBuffer) -> int:
    raise OSError(errno.ENOSPC, "No space left on device")


@pytest.fixture
def writer(tmp_path: Path) -> Iterator[JsonlWriter]:
    writer = JsonlWriter(tmp_path / "pages.jsonl")
    yield writer
    writer.close()


def urls(writer: JsonlWriter) -> list[object]:
    return [line["url"] for line in read_records(writer.path)]


def test_a_short_write_is_followed_by_the_rest_of_the_line(
    writer: JsonlWriter, monkeypatch: pytest.MonkeyPatch
) -> None:
    with monkeypatch.context() as patch:
        patch.setattr(os, "write", prefix_then(writer.path, os.write))
        writer.write(record(1))
    writer.write(record(2))
    assert urls(writer) == ["http://site.test/page/1", "http://site.test/page/2"]


def test_a_line_the_disk_cut_short_raises_and_the_next_one_stands_alone(
    writer: JsonlWriter, monkeypatch: pytest.MonkeyPatch
) -> None:
    writer.write(record(1))
    with monkeypatch.context() as patch:
        patch.setattr(os, "write", prefix_then(writer.path, disk_full))
        with pytest.raises(OSError, match="No space left"):
            writer.write(record(2))
    writer.write(record(3))
    assert urls(writer) == ["http://site.test/page/1", "http://site.test/page/3"]
