"""`crawlq warc check`: WARC files and their index, read against each other, and put right.

The WARC files are the truth; the index (store.py) is derived from them and can be rebuilt.
Every file is scanned gzip member by member (a record is one member, warc.py), without
trusting the index, and the index is compared with what was found:

- a whole `response` or `conversion` record the index lacks (its index lost or deleted, a
  file copied in from another crawl, a kill between a record's sync and its index commit)
  is *unindexed*: repair indexes it;
- an index row that leads to no whole record of its kind (its file gone, cut off, damaged)
  is *stale*: reading it raises UnreadableRecord; repair drops it, so the URL's older
  record, if any, is the one read;
- a file that ends in part of a record (a writer killed mid-write, or one whose cut-back
  failed on a full disk) has a *torn tail*: crawlq never appends to it again, but a
  sequential reader (`warcio check`, replay tools) trips on it; repair cuts it off;
- bytes in the middle of a file that are no gzip member (a damaged disk) are *damage*: the
  scan goes on at the next member it finds, and the records in between are lost.

A file a live writer holds (its flock, warc.py) is scanned but not judged: its newest records
are not indexed until the writer's next sync, and its tail may be mid-write. Repair refuses
to run while a writer holds any file of the folder.
"""

from __future__ import annotations

import fcntl
import os
import sqlite3
import zlib
from collections.abc import Callable, Iterator
from contextlib import closing
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

from ..errors import ConfigError
from .redact import redact_url
from .store import INDEX_FILE, INSERT_RENDITION, INSERT_RESPONSE, open_index
from .warc import warc_time

#: Bytes read from a file at a time: the scanner hands zlib this much, and zlib copies what
#: is left after a member's end, so small reads keep a file of small records linear.
_READ = 16 << 10
#: Output kept of each member: its WARC headers and the HTTP status line are at its start.
_HEAD = 16 << 10
#: A member is inflated this much at a time (its body is thrown away).
_INFLATE = 1 << 20
_GZIP_MAGIC = b"\x1f\x8b\x08"
_INDEXED_KINDS = {"response": "responses", "conversion": "renditions"}


@dataclass(frozen=True, slots=True)
class Record:
    """A whole record found in a file."""

    offset: int
    length: int
    kind: str  # its WARC-Type
    url: str
    fetched_at: float
    status: int  # a response's HTTP status; 0 for other kinds


@dataclass(slots=True)
class FileScan:
    name: str
    size: int
    in_use: bool
    records: list[Record] = field(default_factory=list)
    torn_at: int | None = None  # where a torn tail starts
    damage: list[tuple[int, int, str]] = field(default_factory=list)  # (start, end, why)


@dataclass(frozen=True, slots=True)
class StaleRow:
    table: str
    id: int
    url: str
    file: str
    offset: int
    why: str


@dataclass(slots=True)
class CheckReport:
    directory: Path
    files: list[FileScan]
    unindexed: list[tuple[str, Record]]  # (file, record)
    stale: list[StaleRow]
    repaired: bool = False

    @property
    def records(self) -> int:
        return sum(len(f.records) for f in self.files)

    @property
    def torn(self) -> list[FileScan]:
        return [f for f in self.files if f.torn_at is not None and not f.in_use]

    @property
    def damaged(self) -> list[FileScan]:
        return [f for f in self.files if f.damage]

    @property
    def clean(self) -> bool:
        """Nothing to repair (damage in the middle of a file cannot be: it is reported)."""
        return not (self.unindexed or self.stale or self.torn)


def warc_files(directory: Path) -> list[Path]:
    """The WARC files of `directory`, in name order (each writer's in the order it made them)."""
    return sorted(directory.glob("*.warc.gz"))


def warc_directory(path: Path) -> Path:
    """The WARC folder of `path`: itself, or its `warc/` (a crawl's --out, a pipeline's data)."""
    for candidate in (path, path / "warc"):
        if (candidate / INDEX_FILE).exists() or warc_files(candidate):
            return candidate
    raise ConfigError(f"{path}: no WARC files or {INDEX_FILE} here, nor in {path / 'warc'}")


def check(
    directory: Path, *, repair: bool = False, progress: Callable[[int], None] | None = None
) -> CheckReport:
    """Scans every file of `directory` and compares the index with it; with `repair` (refused
    while a crawl writes there), indexes the unindexed records, drops the stale rows and cuts
    off torn tails. `progress` is called with the bytes scanned as the scan goes. Without
    `repair` nothing is written (a missing index is read as an empty one)."""
    files = [scan_file(path, progress) for path in warc_files(directory)]
    held = [scan.name for scan in files if scan.in_use]
    if repair and held:
        # A running crawl's file between two records is held by no one, and its last records
        # are indexed at the crawl's next sync: indexed here too, they would be twice.
        raise ConfigError(
            f"{directory}: a crawl is writing here ({held[0]} is open): stop it, then repair"
            " (checking alone is safe)"
        )
    if not repair and not (directory / INDEX_FILE).exists():
        return compare(directory, files, None)
    with closing(open_index(directory / INDEX_FILE)) as index:
        report = compare(directory, files, index)
        if repair and not report.clean:
            _repair(report, index)
    return report


def scan_file(path: Path, progress: Callable[[int], None] | None = None) -> FileScan:
    """Every whole record of the file at `path`, its torn tail and its damage. `progress` is
    called with the bytes read since its last call."""
    done = 0

    def advance(position: int) -> None:
        nonlocal done
        if progress is not None and position > done:
            progress(position - done)
        done = max(done, position)

    with open(path, "rb", buffering=1 << 20) as file:
        scan = FileScan(name=path.name, size=os.fstat(file.fileno()).st_size, in_use=_held(file))
        for found in _members(file, advance):
            if isinstance(found, Record):
                scan.records.append(found)
            elif found[1] is None or found[1] >= scan.size:
                scan.torn_at = found[0]  # damage up to the end is a tail all the same
            elif scan.damage and scan.damage[-1][1] == found[0]:  # a false header inside it
                scan.damage[-1] = (scan.damage[-1][0], found[1], scan.damage[-1][2])
            else:
                scan.damage.append((found[0], found[1], found[2]))
        advance(scan.size)
    return scan


def _held(file: BinaryIO) -> bool:
    """Whether a live writer holds the file (warc.py's RotatingWarcWriter locks its own)."""
    try:
        fcntl.flock(file.fileno(), fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    fcntl.flock(file.fileno(), fcntl.LOCK_UN)
    return False


_Found = Record | tuple[int, None, None] | tuple[int, int, str]


def _members(file: BinaryIO, progress: Callable[[int], None]) -> Iterator[_Found]:
    """The file's whole records in order; (start, None, None) for a torn tail; (start, end,
    why) for damage, after which the scan resumes at the next gzip header. `progress` is
    called with how far into the file the scan is."""
    start = position = 0  # where the member begins; where `data` begins in the file
    inflater = zlib.decompressobj(zlib.MAX_WBITS | 16)
    head = bytearray()
    data = b""
    while True:
        if not data:
            data = file.read(_READ)
            progress(position + len(data))
            if not data:
                if position > start:
                    yield (start, None, None)
                return
        try:
            out = inflater.decompress(data, _INFLATE)
        except zlib.error as exc:
            resume = _next_member(file, start + 1)
            progress(resume)
            yield (start, resume, f"not a gzip member: {exc}")
            start = position = resume
            inflater, head, data = zlib.decompressobj(zlib.MAX_WBITS | 16), bytearray(), b""
            continue
        if len(head) < _HEAD:
            head += out[: _HEAD - len(head)]
        if inflater.eof:
            rest = inflater.unused_data
            position += len(data) - len(rest)
            record = _record(start, position - start, bytes(head))
            if record is not None:
                yield record
            start = position
            inflater, head, data = zlib.decompressobj(zlib.MAX_WBITS | 16), bytearray(), rest
        else:
            rest = inflater.unconsumed_tail
            position += len(data) - len(rest)
            data = rest


def _next_member(file: BinaryIO, offset: int) -> int:
    """Where the next gzip header at or after `offset` is (the file's end if none), leaving
    the file there."""
    file.seek(offset)
    carry = b""
    while True:
        chunk = file.read(1 << 20)
        if not chunk:
            end = file.seek(0, os.SEEK_END)
            return end
        window = carry + chunk
        found = window.find(_GZIP_MAGIC)
        if found >= 0:
            at = offset - len(carry) + found
            file.seek(at)
            return at
        carry = window[-(len(_GZIP_MAGIC) - 1) :]
        offset += len(chunk)


def _record(offset: int, length: int, head: bytes) -> Record | None:
    """The record whose inflated start is `head`; None for a warcinfo or another kind."""
    block, _, rest = head.partition(b"\r\n\r\n")
    if not block.startswith(b"WARC/"):
        return None
    lowered = block.lower()
    kind = _field(block, lowered, b"\r\nwarc-type:").decode("ascii", "replace")
    if kind not in _INDEXED_KINDS:
        return None
    status = 0
    if kind == "response":
        status_line = rest.split(b"\r\n", 1)[0].split(b" ", 2)
        if len(status_line) > 1 and status_line[1].isdigit():
            status = int(status_line[1])
    url = _field(block, lowered, b"\r\nwarc-target-uri:").decode("utf-8", "replace")
    date = _field(block, lowered, b"\r\nwarc-date:").decode("ascii", "replace")
    return Record(
        offset=offset,
        length=length,
        kind=kind,
        url=redact_url(url),
        fetched_at=_when(date),
        status=status,
    )


def _field(block: bytes, lowered: bytes, name: bytes) -> bytes:
    """The value of the header `name` (lower case, with the line end before it) in `block`."""
    at = lowered.find(name)
    if at < 0:
        return b""
    at += len(name)
    end = block.find(b"\r\n", at)
    return block[at : end if end >= 0 else len(block)].strip()


def _when(date: str) -> float:
    """A WARC-Date in seconds since the epoch (0 when it is none)."""
    try:
        return warc_time(date)
    except ValueError:
        return 0.0


def compare(
    directory: Path, files: list[FileScan], index: sqlite3.Connection | None
) -> CheckReport:
    """The index (None: none) read against the files as scanned."""
    by_file = {scan.name: scan for scan in files}
    whole = {
        (scan.name, r.offset): (r.length, _INDEXED_KINDS[r.kind])
        for scan in files
        for r in scan.records
    }
    indexed: set[tuple[str, int, int, str]] = set()
    stale: list[StaleRow] = []
    for table in ("responses", "renditions"):
        query = f"SELECT id, url, file, offset, length FROM {table}"
        for row_id, url, name, offset, length in index.execute(query) if index else ():
            scan = by_file.get(name)
            found = whole.get((name, offset))
            if found == (length, table):
                indexed.add((name, offset, length, table))
                continue
            if scan is None and (directory / name).exists():
                continue  # a file a running crawl made after the scan began
            if scan is not None and scan.in_use:
                continue  # being written: judged once its writer is done
            if scan is None:
                why = "its file is missing"
            elif found is not None and found[1] != table:
                why = f"the record there is not of the kind its table holds ({table})"
            elif found is not None:
                why = f"the record there is {found[0]} bytes, not {length}"
            elif scan.torn_at is not None and offset >= scan.torn_at:
                why = "the record was cut off (torn tail)"
            else:
                why = "no whole record starts there"
            stale.append(StaleRow(table, row_id, url, name, offset, why))
    unindexed = [
        (scan.name, r)
        for scan in files
        if not scan.in_use
        for r in scan.records
        if (scan.name, r.offset, r.length, _INDEXED_KINDS[r.kind]) not in indexed
    ]
    return CheckReport(directory=directory, files=files, unindexed=unindexed, stale=stale)


def _repair(report: CheckReport, index: sqlite3.Connection) -> None:
    """One transaction for the index, then the torn tails: a tail is cut only once no row
    leads into it, and only while no writer holds its file."""
    index.execute("BEGIN IMMEDIATE")
    try:
        for row in report.stale:
            index.execute(f"DELETE FROM {row.table} WHERE id = ?", (row.id,))
        responses = [
            (r.url, r.fetched_at, r.status, name, r.offset, r.length)
            for name, r in report.unindexed
            if r.kind == "response"
        ]
        renditions = [
            (r.url, r.fetched_at, name, r.offset, r.length)
            for name, r in report.unindexed
            if r.kind == "conversion"
        ]
        index.executemany(INSERT_RESPONSE, responses)
        index.executemany(INSERT_RENDITION, renditions)
        index.execute("COMMIT")
    except BaseException:
        if index.in_transaction:
            index.execute("ROLLBACK")
        raise
    for scan in report.torn:
        assert scan.torn_at is not None
        _cut(report.directory / scan.name, scan.torn_at)
    report.repaired = True


def _cut(path: Path, at: int) -> None:
    with open(path, "r+b") as file:
        try:
            fcntl.flock(file.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise ConfigError(f"{path}: a writer took it during the check; run it again") from None
        os.ftruncate(file.fileno(), at)
        os.fsync(file.fileno())
