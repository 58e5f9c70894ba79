"""Bodies: undoing Content-Encoding within a size cap, and finding the charset of text."""

from __future__ import annotations

import codecs
import re
import zlib

import brotli
import charset_normalizer

from .errors import FetchError, Reason

#: What servers may compress with; anything else they send is refused as BAD_ENCODING.
ACCEPT_ENCODING = "gzip, deflate, br"

_META_CHARSET = re.compile(rb"""<meta[^>]+charset\s*=\s*["']?([A-Za-z0-9._:-]+)""", re.IGNORECASE)
#: A meta charset must appear early in the document to count (as browsers do).
META_SCAN_BYTES = 4096
#: Charset detection reads this much of a body: detecting on all of a 10 MB page would hold
#: the event loop for over a second.
DETECT_BYTES = 64 * 1024


def decode_content(raw: bytes, encoding: str | None, *, max_bytes: int, url: str) -> bytes:
    """`raw` with its Content-Encoding undone; TOO_LARGE past `max_bytes` decoded (a
    decompression bomb is stopped as it inflates), BAD_ENCODING if the stream is corrupt."""
    codings = [c.strip().lower() for c in (encoding or "").split(",") if c.strip()]
    body = raw
    for coding in reversed(codings):  # applied in order listed, so undone from the last
        if coding in ("identity", ""):
            continue
        try:
            body = _inflate(body, coding, max_bytes, url)
        except (zlib.error, brotli.error, OSError, ValueError) as exc:
            raise FetchError(Reason.BAD_ENCODING, url, f"corrupt {coding} body: {exc}") from exc
    return body


def _inflate(data: bytes, coding: str, max_bytes: int, url: str) -> bytes:
    """Inflates at most `max_bytes` + 1 bytes, whatever the ratio (gzip bodies of several
    members, as concatenated files are, count together)."""
    if coding == "br":
        return _unbrotli(data, max_bytes, url)
    if coding in ("gzip", "x-gzip"):
        wbits = 16 + zlib.MAX_WBITS
    elif coding == "deflate":
        # Servers send zlib-wrapped or raw deflate under this name; zlib tells them apart.
        wbits = zlib.MAX_WBITS if data[:1] == b"\x78" else -zlib.MAX_WBITS
    else:
        raise ValueError(f"unsupported content encoding {coding!r}")
    parts: list[bytes] = []
    size = 0
    while data:
        inflater = zlib.decompressobj(wbits)
        try:
            part = inflater.decompress(data, max_bytes + 1 - size)
        except zlib.error:
            if not parts:
                raise
            break  # bytes after the last member that are not one: ignored, as before
        size += len(part)
        if size > max_bytes or inflater.unconsumed_tail:
            raise FetchError(Reason.TOO_LARGE, url, f"decoded body over {max_bytes} bytes")
        parts.append(part)
        if not inflater.eof or coding == "deflate":
            break  # a truncated stream gives what it holds, as browsers show it
        data = inflater.unused_data
    return b"".join(parts)


def _unbrotli(data: bytes, max_bytes: int, url: str) -> bytes:
    """Brotli, at most `max_bytes` + 1 bytes out whatever the ratio."""
    decompressor = brotli.Decompressor()
    body: bytes = decompressor.process(data, output_buffer_limit=max_bytes + 1)
    if len(body) > max_bytes or not decompressor.can_accept_more_data():
        raise FetchError(Reason.TOO_LARGE, url, f"decoded body over {max_bytes} bytes")
    return body


#: Python codecs that are no web page's charset, though text codecs: Python's own, and
#: UTF-7, which browsers refuse. (base64, zlib, rot13 and the like are not text codecs.)
NOT_WEB_CHARSETS = frozenset(
    {"undefined", "idna", "punycode", "unicode-escape", "raw-unicode-escape", "utf-7"}
)


def known_charset(name: str | None) -> str | None:
    """The codec a page's charset names, if it is one a page can be written in."""
    if not name:
        return None
    try:
        codec = codecs.lookup(name)
    except LookupError:
        return None
    if not codec._is_text_encoding or codec.name in NOT_WEB_CHARSETS:
        return None
    return codec.name


def meta_charset(body: bytes) -> str | None:
    match = _META_CHARSET.search(body[:META_SCAN_BYTES])
    return match.group(1).decode("ascii") if match else None


def decode_text(body: bytes, declared: str | None, url: str, *, html: bool = True) -> str:
    """The header's charset, else the page's meta charset, must decode the body strictly; a
    page that declares none is tried as UTF-8, then detected. BAD_ENCODING when the body
    fails its declared charset, or no charset fits it."""
    if body.startswith(codecs.BOM_UTF8):
        return body[len(codecs.BOM_UTF8) :].decode("utf-8", "replace")
    name = declared or (meta_charset(body) if html else None)
    charset = known_charset(name)
    if charset is not None:
        try:
            return body.decode(charset)
        except UnicodeError as exc:
            at = f" (at byte {exc.start})" if isinstance(exc, UnicodeDecodeError) else ""
            raise FetchError(Reason.BAD_ENCODING, url, f"body is not valid {charset}{at}") from exc
    try:
        return body.decode("utf-8")
    except UnicodeDecodeError:
        pass
    best = charset_normalizer.from_bytes(body[:DETECT_BYTES]).best()
    if best is None or best.encoding is None:
        what = f"unknown charset {name!r}" if name else "no charset declared"
        raise FetchError(Reason.BAD_ENCODING, url, f"{what} and none detected")
    return body.decode(best.encoding, "replace")  # detected on a sample: the rest may stray
