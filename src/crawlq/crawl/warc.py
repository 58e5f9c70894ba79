"""WARC files (warcio): one gzip member per record, files rotated by size.

Every file starts with a warcinfo record; each response is one `response` record holding
the status line, the headers and the body exactly as received (compressed if the server
compressed it). `Transfer-Encoding` is dropped: the body is stored de-chunked. Bytes outside
ASCII in the status line and the headers are stored %-escaped (%E9), as WARC headers are
ASCII. A page a browser rendered has a `conversion` record besides: its DOM once rendered,
as UTF-8 HTML, for the document's URL (`Rendition`). Each record is built in memory first,
so one that cannot be written leaves nothing behind in the file and fails alone. Credentials
are left out (redact.py): the userinfo of WARC-Target-URI, and the values of Set-Cookie,
Cookie and Authorization headers and of every header named as a secret (X-Auth-Token).

A record is read back (`read_record`, `read_rendition`) whole or not at all: one whose file is
missing, cut off (a kill in the middle of its write, a damaged disk) or holds something else
at its offset raises `UnreadableRecord` (a CrawlqError) naming the file and the offset.
"""

from __future__ import annotations

import errno
import fcntl
import functools
import hashlib
import os
import string
import time
import zlib
from collections.abc import Sequence
from contextlib import suppress
from dataclasses import dataclass
from datetime import UTC, datetime
from io import BytesIO, FileIO
from pathlib import Path
from typing import Any

from warcio.archiveiterator import ArchiveIterator
from warcio.exceptions import ArchiveLoadFailed
from warcio.recordloader import ArcWarcRecord
from warcio.warcwriter import WARCWriter

from ..errors import CrawlqError
from .decoding import decode_content, decode_text
from .redact import redact_header, redact_url
from .response import _CHARSET, Response

DEFAULT_FILE_BYTES = 1 << 30
#: zlib's own default, as gzip's: records about 2% larger than at warcio's 9 for several
#: times less CPU on big pages.
DEFAULT_COMPRESS_LEVEL = 6
WARC_VERSION = "WARC/1.0"
_DROPPED = frozenset({"transfer-encoding"})
#: A batch of records is written in parts of about this size at most.
MAX_WRITE_BYTES = 8 << 20
#: A stored body is inflated up to this size when read back.
MAX_STORED_BODY = 1 << 30


@dataclass(frozen=True, kw_only=True, slots=True)
class RecordRef:
    file: str  # name inside the WARC directory
    offset: int
    length: int


@dataclass(frozen=True, kw_only=True, slots=True)
class StoredResponse:
    url: str
    status: int
    headers: tuple[tuple[str, str], ...]
    raw: bytes  # the body as it came over the wire
    fetched_at: float

    def header(self, name: str) -> str | None:
        wanted = name.lower()
        return next((v for k, v in self.headers if k.lower() == wanted), None)

    @property
    def content_type(self) -> str:
        return (self.header("Content-Type") or "").split(";", 1)[0].strip().lower()

    @property
    def body(self) -> bytes:
        """`raw` with its Content-Encoding undone."""
        return decode_content(
            self.raw, self.header("Content-Encoding"), max_bytes=MAX_STORED_BODY, url=self.url
        )

    def text(self) -> str:
        """The body as text, by the declared, meta or detected charset."""
        match = _CHARSET.search(self.header("Content-Type") or "")
        html = self.content_type in ("text/html", "application/xhtml+xml")
        return decode_text(self.body, match.group(1) if match else None, self.url, html=html)


def _ascii(text: str) -> str:
    """Header text (each character one byte the server sent, as Latin-1) as ASCII: control
    characters and bytes past 0x7E %-escaped."""
    if text.isascii() and text.isprintable():
        return text
    return "".join(c if " " <= c <= "~" or c == "\t" else f"%{ord(c) & 0xFF:02X}" for c in text)


@functools.lru_cache(maxsize=4096)
def _header_name(name: str) -> str | None:
    """A response header's name as its WARC record writes it; None: left out."""
    return None if name.lower() in _DROPPED else _ascii(name)


#: Base32 (RFC 4648) ten bits at a time: a SHA-1 digest's 160 bits are 16 lookups, where
#: base64.b32encode, Python code, takes five times as long.
_B32_PAIRS = [
    a + b for a in string.ascii_uppercase + "234567" for b in string.ascii_uppercase + "234567"
]
_B32_SHIFTS = range(150, -1, -10)


def _digest(*parts: bytes) -> str:
    sha1 = hashlib.sha1(usedforsecurity=False)
    for part in parts:
        sha1.update(part)
    bits = int.from_bytes(sha1.digest(), "big")
    return "sha1:" + "".join([_B32_PAIRS[(bits >> shift) & 1023] for shift in _B32_SHIFTS])


def _record_id() -> str:
    """A random (version 4) UUID, as str(uuid.uuid4()) writes it, in half its time."""
    raw = bytearray(os.urandom(16))
    raw[6] = raw[6] & 0x0F | 0x40
    raw[8] = raw[8] & 0x3F | 0x80
    h = raw.hex()
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


@dataclass(frozen=True, kw_only=True, slots=True)
class Rendition:
    """The DOM of a page a browser rendered from the document at `url` (the page ended up at
    `final_url`, where a script navigated on), stored as a WARC `conversion` record."""

    url: str
    final_url: str
    html: str
    fetched_at: float  # when rendering finished

    @property
    def body(self) -> bytes:
        return self.html.encode("utf-8", "replace")


def conversion_record(rendition: Rendition) -> bytes:
    """The WARC `conversion` record of a rendered DOM, uncompressed."""
    body = rendition.body
    warc_headers = (
        f"{WARC_VERSION}\r\n"
        f"WARC-Date: {warc_date(rendition.fetched_at)}\r\n"
        f"WARC-Record-ID: <urn:uuid:{_record_id()}>\r\n"
        "WARC-Type: conversion\r\n"
        f"WARC-Target-URI: {redact_url(rendition.url)}\r\n"
        f"WARC-Refers-To-Target-URI: {redact_url(rendition.final_url)}\r\n"
        f"WARC-Payload-Digest: {_digest(body)}\r\n"
        f"WARC-Block-Digest: {_digest(body)}\r\n"
        "Content-Type: text/html; charset=utf-8\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    )
    return b"".join((warc_headers.encode("utf-8"), body, b"\r\n\r\n"))


def response_record(response: Response) -> bytes:
    """The WARC `response` record of `response`, uncompressed: what warcio's
    `create_warc_record(..., "response", ...)` writes, header for header, built directly
    (warcio's builder cost the writing thread more than compressing the record did)."""
    lines = [f"{response.http_version} {_ascii(f'{response.status} {response.reason}'.strip())}"]
    for name, value in response.headers:
        written = _header_name(name)
        if written is not None:
            lines.append(f"{written}: {_ascii(redact_header(name, value))}")
    lines.append("\r\n")
    http = "\r\n".join(lines).encode("ascii")
    body = response.raw
    warc_headers = (
        f"{WARC_VERSION}\r\n"
        f"WARC-Date: {warc_date(response.fetched_at)}\r\n"
        f"WARC-Record-ID: <urn:uuid:{_record_id()}>\r\n"
        "WARC-Type: response\r\n"
        f"WARC-Target-URI: {redact_url(response.url)}\r\n"
        f"WARC-Payload-Digest: {_digest(body)}\r\n"
        f"WARC-Block-Digest: {_digest(http, body)}\r\n"
        "Content-Type: application/http; msgtype=response\r\n"
        f"Content-Length: {len(http) + len(body)}\r\n\r\n"
    )
    return b"".join((warc_headers.encode("utf-8"), http, body, b"\r\n\r\n"))


def warc_date(epoch: float) -> str:
    return datetime.fromtimestamp(epoch, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def warc_time(date: str) -> float:
    """A WARC-Date (as `warc_date` writes it, or ISO 8601 as other tools do) in seconds since
    the epoch; UTC unless it says otherwise. ValueError if it is no such date."""
    moment = datetime.fromisoformat(date)
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return moment.timestamp()


class RotatingWarcWriter:
    """Appends records to `<prefix>-<stamp>-<pid>-<n>.warc.gz` files, a new one after each
    reaches `max_file_bytes`. Each writer writes files of its own: it creates each, never
    appending to a file another made (two in one process and second would have taken the same
    name, and each its own offsets in it). Not thread safe: one thread writes.

    Files are unbuffered: a record is in the file, whole, once `write` returns, and on disk
    once `sync` returns (a file is synced before it is closed, and its directory once it is
    created, so a power loss cannot drop it either). A record that fails halfway (a full disk)
    is cut back off, as a file ending in part of a gzip member would hide every record after
    it from a sequential reader; if even that fails, the file is left as it is and the next
    record starts a new one."""

    def __init__(
        self,
        directory: Path,
        *,
        prefix: str = "crawlq",
        max_file_bytes: int,
        compress_level: int = DEFAULT_COMPRESS_LEVEL,
    ) -> None:
        self.directory = directory
        self.prefix = prefix
        self.max_file_bytes = max_file_bytes
        self.compress_level = compress_level
        self._run = f"{time.strftime('%Y%m%d%H%M%S', time.gmtime())}-{os.getpid()}"
        self._sequence = 0
        self._file: FileIO | None = None
        self._name = ""
        self._unsynced = False  # the open file has records not yet on disk
        self._lost: OSError | None = None  # a failed sync of a file closed since the last `sync`

    def _open(self) -> FileIO:
        if self._file is None:
            self.directory.mkdir(parents=True, exist_ok=True)
            name, file = self._new_file()
            path = self.directory / name
            try:
                _append(file, _warcinfo(name))
                _sync_directory(self.directory)
            except BaseException:
                _close_quietly(file)
                path.unlink(missing_ok=True)
                raise
            self._file, self._name, self._unsynced = file, name, True
        return self._file

    def _new_file(self) -> tuple[str, FileIO]:
        """The next file of this writer's own: created by it, never one another left (another
        writer of this process in this second, or a process of the same pid killed in it)."""
        while True:
            name = f"{self.prefix}-{self._run}-{self._sequence:05d}.warc.gz"
            self._sequence += 1
            with suppress(FileExistsError):
                return name, _hold(open(self.directory / name, "xb", buffering=0))

    def write(self, item: Response | Rendition) -> RecordRef:
        """Appends one record, whole, or raises and leaves the file as it was."""
        result = self.write_many([item])[0]
        if isinstance(result, Exception):
            raise result
        return result

    def write_many(self, items: Sequence[Response | Rendition]) -> list[RecordRef | Exception]:
        """Appends the records of `items`, each whole or not at all, in one write a file (a
        system call a record cost the writing thread as much as building it). A record that
        cannot be built or written fails alone: a batch whose write fails is cut back off and
        written again one record at a time."""
        results: list[RecordRef | Exception | None] = [None] * len(items)
        run: list[tuple[int, bytes]] = []  # (index, gzip member): what the next write holds
        start = end = 0  # where the run starts and ends in the open file
        for index, item in enumerate(items):
            try:
                member = self._member(item)
            except (ValueError, UnicodeError) as exc:
                results[index] = exc
                continue
            if not run:
                try:
                    start = end = self._open().tell()
                except OSError as exc:  # as a write alone did: this record fails
                    results[index] = exc
                    continue
            run.append((index, member))
            end += len(member)
            # The record that fills the file closes it; a long batch goes out in parts.
            if end >= self.max_file_bytes or end - start >= MAX_WRITE_BYTES:
                self._write_run(run, results)
                run = []
        if run:
            self._write_run(run, results)
        written = [result for result in results if result is not None]
        assert len(written) == len(items)
        return written

    def _member(self, item: Response | Rendition) -> bytes:
        """The record of `item`, as one gzip member. A small record is compressed with a window
        and hash table its size: setting up zlib's default ones cost more than compressing a
        small page (and the few bytes they may save on it)."""
        record = conversion_record(item) if isinstance(item, Rendition) else response_record(item)
        window = min(max(len(record).bit_length(), 9), zlib.MAX_WBITS)
        compressor = zlib.compressobj(
            self.compress_level, zlib.DEFLATED, window + 16, min(window - 6, 8)
        )
        return compressor.compress(record) + compressor.flush()

    def _write_run(self, run: list[tuple[int, bytes]], results: list[Any]) -> None:
        try:
            file = self._open()
            offset = file.tell()
            _append(file, b"".join(member for _, member in run))
        except OSError as exc:
            if isinstance(exc, _Torn):
                # The members wholly written before the tear stay in the file: theirs.
                whole = offset + exc.written
                while run and offset + len(run[0][1]) <= whole:
                    index, member = run.pop(0)
                    results[index] = RecordRef(file=self._name, offset=offset, length=len(member))
                    offset += len(member)
                    self._unsynced = True
                with suppress(OSError):
                    self.close()  # the next record starts a new file
                if not run:
                    return
            if len(run) == 1:
                results[run[0][0]] = exc
                return
            for one in run:  # only the records that cannot be written fail
                self._write_run([one], results)
            return
        self._unsynced = True
        for index, member in run:
            results[index] = RecordRef(file=self._name, offset=offset, length=len(member))
            offset += len(member)
        if offset >= self.max_file_bytes:
            try:
                self.close()
            except OSError as exc:  # as a write alone did: its record fails
                results[run[-1][0]] = exc

    def sync(self) -> None:
        """Puts every record written since the last call on disk, or raises: then some may not
        be. A file whose sync failed is not written again (Linux may have dropped its unwritten
        pages and marked them clean): the next record starts a new one."""
        lost, self._lost = self._lost, None
        if self._file is not None and self._unsynced:
            try:
                os.fsync(self._file.fileno())
                self._unsynced = False
            except OSError as exc:
                lost = exc
                self._drop()
        if lost is not None:
            raise lost

    def close(self) -> None:
        """Syncs and closes the current file; the next record opens a new one even if that
        fails (a failed sync is raised again by the next `sync`)."""
        file = self._file
        if file is None:
            return
        if self._unsynced:
            try:
                os.fsync(file.fileno())
            except OSError as exc:
                self._lost = exc
                self._drop()
                raise
        self._file, self._unsynced = None, False
        file.close()

    def _drop(self) -> None:
        file, self._file, self._unsynced = self._file, None, False
        if file is not None:
            _close_quietly(file)


class _Torn(OSError):
    """A record failed halfway and could not be cut back off: its file ends in part of it."""

    written = 0  # bytes of the failed write that made it into the file


def _append(file: FileIO, data: bytes) -> int:
    """Writes all of `data` at the end of `file` and returns where it starts; if that fails,
    cuts back off what was written and raises the failure."""
    offset = file.tell()
    try:
        _write_all(file, data)
    except BaseException:
        try:
            os.ftruncate(file.fileno(), offset)
            file.seek(offset)
        except OSError as exc:
            torn = _Torn(exc.errno, f"{file.name}: cannot cut back a failed record")
            torn.written = file.tell() - offset
            raise torn from exc
        raise
    return offset


def _write_all(file: FileIO, data: bytes) -> None:
    """Writes `data` through short writes, which a nearly full disk makes."""
    view = memoryview(data)
    while view:
        written = file.write(view)
        if not written:
            raise OSError(errno.ENOSPC, f"{file.name}: nothing written")
        view = view[written:]


def _hold(file: FileIO) -> FileIO:
    """Marks the file as being written until it is closed (or its process dies): `crawlq warc
    check` leaves such a file alone. A file system without flock goes without the mark."""
    with suppress(OSError):
        fcntl.flock(file.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    return file


def _sync_directory(directory: Path) -> None:
    """Puts a new file's name on disk: a synced file whose name was not is lost all the same."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _close_quietly(file: FileIO) -> None:
    with suppress(OSError):
        file.close()


def _warcinfo(name: str) -> bytes:
    """The warcinfo record that opens file `name`, as one gzip member."""
    buffer = BytesIO()
    writer = WARCWriter(buffer, gzip=True)
    fields = {"software": "crawlq", "format": "WARC File Format 1.1"}
    writer.write_record(writer.create_warcinfo_record(name, fields))
    return buffer.getvalue()


class UnreadableRecord(CrawlqError):
    """A stored record cannot be read back: its file is missing or unreadable, or the bytes
    at its offset are not one whole record of the kind asked for (cut off, or another's)."""

    def __init__(self, directory: Path, ref: RecordRef, problem: str) -> None:
        super().__init__(f"WARC record {directory / ref.file} at {ref.offset}: {problem}")
        self.ref = ref


def read_rendition(directory: Path, ref: RecordRef) -> Rendition:
    """The conversion record at `ref` (a rendered DOM), read without scanning the file."""
    record = _record_at(directory, ref, "conversion")
    headers = record.rec_headers
    return Rendition(
        url=headers.get_header("WARC-Target-URI"),
        final_url=headers.get_header("WARC-Refers-To-Target-URI") or "",
        html=record.raw_stream.read().decode("utf-8", "replace"),
        fetched_at=_fetched_at(record),
    )


def read_record(directory: Path, ref: RecordRef) -> StoredResponse:
    """The response record at `ref`, read without scanning the file."""
    record = _record_at(directory, ref, "response")
    http = record.http_headers
    return StoredResponse(
        url=record.rec_headers.get_header("WARC-Target-URI"),
        status=int(http.get_statuscode()),
        headers=tuple((str(k), str(v)) for k, v in http.headers),
        raw=record.raw_stream.read(),
        fetched_at=_fetched_at(record),
    )


def _record_at(directory: Path, ref: RecordRef, kind: str) -> ArcWarcRecord:
    """The record of type `kind` at `ref`, once its bytes are checked to be one whole gzip
    member: warcio reads a record cut off by a kill or a damaged disk as a shorter one."""
    try:
        with open(directory / ref.file, "rb") as file:
            file.seek(ref.offset)
            member = file.read(ref.length)
    except OSError as exc:
        raise UnreadableRecord(directory, ref, exc.strerror or str(exc)) from None
    if len(member) < ref.length:
        problem = f"cut off: the file ends {len(member)} of its {ref.length} bytes in"
        raise UnreadableRecord(directory, ref, problem)
    inflater = zlib.decompressobj(zlib.MAX_WBITS | 16)
    try:
        data = inflater.decompress(member, MAX_STORED_BODY + (1 << 20))
    except zlib.error as exc:
        raise UnreadableRecord(directory, ref, f"not a whole gzip member: {exc}") from None
    if not inflater.eof or inflater.unused_data:
        problem = f"not a whole gzip member in its {ref.length} bytes (cut off or damaged)"
        raise UnreadableRecord(directory, ref, problem)
    try:
        record = next(iter(ArchiveIterator(BytesIO(data))), None)
    except ArchiveLoadFailed as exc:
        raise UnreadableRecord(directory, ref, f"not a WARC record ({exc})") from None
    if record is None or record.rec_type != kind:
        found = "nothing" if record is None else f"a {record.rec_type} record"
        raise UnreadableRecord(directory, ref, f"{found}, not a {kind} record")
    return record


def _fetched_at(record: ArcWarcRecord) -> float:
    return warc_time(record.rec_headers.get_header("WARC-Date"))
