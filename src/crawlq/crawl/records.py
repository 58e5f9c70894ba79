"""Page records: one JSON line per fetch outcome, errors included (errors are data)."""

from __future__ import annotations

import dataclasses
import errno
import fcntl
import json
import os
from contextlib import suppress
from dataclasses import dataclass
from pathlib import Path

from .redact import redact_url


@dataclass(frozen=True, kw_only=True, slots=True)
class PageRecord:
    url: str
    depth: int
    attempt: int
    status: int | None  # of the last response received; None if none was
    final_url: str | None = None
    title: str | None = None
    links: int = 0  # links found on the page (before scope rules), at most links.MAX_LINKS
    links_dropped: int = 0  # link elements after the MAX_LINKS-th link, unread (PageLinks)
    queued: int = 0  # of those, newly added to the crawl
    bytes: int = 0
    content_type: str | None = None
    fetched_at: float | None = None  # epoch seconds, when the last response arrived
    fetch_time: float | None = None  # seconds from request to the full body, all hops
    redirects: int = 0
    error: str | None = None  # a Reason value
    detail: str | None = None
    retry: bool = False  # the page will be tried again
    warc: str | None = None  # file:offset of the last response's record
    rendered: str | None = None  # file:offset of the rendered DOM's record (links read from it)

    def to_json(self) -> str:
        """One line; URLs without their credentials (`detail` comes from a FetchError, which
        has none)."""
        # Every field is a plain value: no need for asdict's deep copy.
        fields = {name: getattr(self, name) for name in _FIELDS}
        fields["url"] = redact_url(self.url)
        if self.final_url is not None:
            fields["final_url"] = redact_url(self.final_url)
        return _ENCODER.encode(fields)


_FIELDS = tuple(f.name for f in dataclasses.fields(PageRecord))
_ENCODER = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False)


class JsonlWriter:
    """Appends lines with one write each to a file opened O_APPEND, so the lines of several
    worker processes never interleave (a nearly full disk may take part of a line: the rest
    follows in more writes, or the write raises). A line a killed process left unfinished at
    the end of the file is ended when the file is opened, so the next line stands alone."""

    def __init__(self, path: Path | str) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._fd = os.open(self.path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o644)
        self._unfinished = False  # a failed write left part of a line at the end
        self._failed: OSError | None = None  # a write since the last sync
        try:
            self._end_torn_line()
        except BaseException:
            self.close()
            raise

    def _end_torn_line(self) -> None:
        """Ends the part of a line a process killed in the middle of its write left at the end
        of the file, or the first line written after it would be lost with it. Under a lock:
        processes starting together end it once."""
        fcntl.flock(self._fd, fcntl.LOCK_EX)
        try:
            size = os.fstat(self._fd).st_size
            if size and os.pread(self._fd, 1, size - 1) != b"\n":
                self._unfinished = True
                with suppress(OSError):  # a full disk: the next line ends it
                    self._write(b"")
        finally:
            fcntl.flock(self._fd, fcntl.LOCK_UN)

    def write(self, record: PageRecord) -> None:
        """Appends the record's line, whole, or raises (and the next `sync` raises the same).
        After a write that left part of a line, the next one ends that part first, so its own
        line stands alone (readers skip the part)."""
        try:
            self._write((record.to_json() + "\n").encode())
        except OSError as exc:
            self._failed = exc
            raise

    def _write(self, line: bytes) -> None:
        if self._unfinished:
            line = b"\n" + line
        rest = memoryview(line)
        try:
            while rest:
                written = os.write(self._fd, rest)
                if not written:
                    raise OSError(errno.ENOSPC, f"{self.path}: nothing written")
                rest = rest[written:]
        finally:
            if not rest:
                self._unfinished = False
            elif len(rest) < len(line):
                self._unfinished = True

    def sync(self) -> None:
        """Puts every line written so far on disk (safe while another thread writes), then
        raises the error of a write that failed since the last call: a worker stops rather
        than fail page after page on a disk that refuses their lines."""
        failed, self._failed = self._failed, None
        os.fsync(self._fd)
        if failed is not None:
            raise failed

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


def read_records(path: Path | str) -> list[dict[str, object]]:
    """Every record of a JSONL file (a torn line, from a kill or a full disk, is skipped, even
    one cut in the middle of a character)."""
    records = []
    with open(path, "rb") as file:
        for line in file:
            try:
                records.append(json.loads(line))
            except ValueError:  # JSONDecodeError, UnicodeDecodeError
                continue
    return records
