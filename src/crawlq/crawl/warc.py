"""WARC files (warcio): one gzip member per record, files rotated by size.

Every file starts with a warcinfo record; each response is one `response` record holding
the status line, the headers and the body exactly as received (compressed if the server
compressed it). `Transfer-Encoding` is dropped: the body is stored de-chunked. Bytes outside
ASCII in the status line and the headers are stored %-escaped (%E9), as WARC headers are
ASCII. Each record is built in memory first, so one that cannot be written leaves nothing
behind in the file and fails alone. Credentials are left out (redact.py): the userinfo of
WARC-Target-URI, and the values of Set-Cookie, Cookie and Authorization headers.
"""

from __future__ import annotations

import base64
import hashlib
import os
import time
import uuid
import zlib
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import BinaryIO

from warcio.archiveiterator import ArchiveIterator
from warcio.warcwriter import WARCWriter

from .decoding import decode_content, decode_text
from .redact import redact_header, redact_url
from .response import _CHARSET, Response

DEFAULT_FILE_BYTES = 1 << 30
#: zlib's own default, as gzip's: records about 2% larger than at warcio's 9 for several
#: times less CPU on big pages.
DEFAULT_COMPRESS_LEVEL = 6
WARC_VERSION = "WARC/1.0"
_GZIP_WBITS = zlib.MAX_WBITS + 16  # a gzip member per record
_DROPPED = frozenset({"transfer-encoding"})
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


def _digest(*parts: bytes) -> str:
    sha1 = hashlib.sha1(usedforsecurity=False)
    for part in parts:
        sha1.update(part)
    return "sha1:" + base64.b32encode(sha1.digest()).decode("ascii")


def response_record(response: Response) -> bytes:
    """The WARC `response` record of `response`, uncompressed: what warcio's
    `create_warc_record(..., "response", ...)` writes, header for header, built directly
    (warcio's builder cost the writing thread more than compressing the record did)."""
    lines = [f"{response.http_version} {_ascii(f'{response.status} {response.reason}'.strip())}"]
    for name, value in response.headers:
        if name.lower() not in _DROPPED:
            lines.append(f"{_ascii(name)}: {_ascii(redact_header(name, value))}")
    lines.append("\r\n")
    http = "\r\n".join(lines).encode("ascii")
    body = response.raw
    warc_headers = (
        f"{WARC_VERSION}\r\n"
        f"WARC-Date: {warc_date(response.fetched_at)}\r\n"
        f"WARC-Record-ID: <urn:uuid:{uuid.uuid4()}>\r\n"
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


class RotatingWarcWriter:
    """Appends records to `<prefix>-<stamp>-<pid>-<n>.warc.gz` files, a new one after each
    reaches `max_file_bytes`. Each process and each run writes files of its own. Not thread
    safe: one thread writes."""

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
        self._file: BinaryIO | None = None
        self._name = ""
        self._writer: WARCWriter | None = None

    def _open(self) -> tuple[BinaryIO, WARCWriter]:
        if self._file is None or self._writer is None:
            self.directory.mkdir(parents=True, exist_ok=True)
            self._name = f"{self.prefix}-{self._run}-{self._sequence:05d}.warc.gz"
            self._sequence += 1
            self._file = open(self.directory / self._name, "ab")  # noqa: SIM115 - kept open
            self._writer = WARCWriter(self._file, gzip=True)
            info = self._writer.create_warcinfo_record(
                self._name, {"software": "crawlq", "format": "WARC File Format 1.1"}
            )
            self._writer.write_record(info)
        return self._file, self._writer

    def write(self, response: Response, *, flush: bool = True) -> RecordRef:
        """Appends one record; `flush=False` leaves it in the file's buffer (call `flush()`
        after a batch)."""
        file, _ = self._open()
        compressor = zlib.compressobj(self.compress_level, zlib.DEFLATED, _GZIP_WBITS)
        member = compressor.compress(response_record(response))
        member += compressor.flush()
        offset = file.tell()
        file.write(member)
        if flush:
            file.flush()
        ref = RecordRef(file=self._name, offset=offset, length=len(member))
        if offset + len(member) >= self.max_file_bytes:
            self.close()
        return ref

    def flush(self) -> None:
        if self._file is not None:
            self._file.flush()

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
        self._file = None
        self._writer = None


def read_record(directory: Path, ref: RecordRef) -> StoredResponse:
    """The response record at `ref`, read without scanning the file."""
    with open(directory / ref.file, "rb") as file:
        file.seek(ref.offset)
        for record in ArchiveIterator(file):
            http = record.http_headers
            status = int(http.get_statuscode())
            date = record.rec_headers.get_header("WARC-Date")
            fetched = datetime.strptime(date, "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=UTC)
            return StoredResponse(
                url=record.rec_headers.get_header("WARC-Target-URI"),
                status=status,
                headers=tuple((str(k), str(v)) for k, v in http.headers),
                raw=record.raw_stream.read(),
                fetched_at=fetched.timestamp(),
            )
    raise ValueError(f"no WARC record at {ref.file}:{ref.offset}")
