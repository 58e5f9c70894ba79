"""A hostile HTTP server on a loopback address, for tests and benchmarks: every way a server
can waste a crawler's time or memory, or answer something that is not quite HTTP.

    async with HostileServer() as server:      # plain HTTP and three TLS ports
        server.url("gzip-bomb", 7)             # http://hostile.test:PORT/gzip-bomb/7
        server.resolve                         # {"hostile.test": "127.0.0.1"} for FetchSettings
        server.ca_file                         # the CA the TLS ports' certificates chain to

Written on raw asyncio streams (an HTTP library would refuse to misbehave this much). Each
kind is served at `/<kind>/<n>` (any n, so a crawl can hold many pages of each kind); `/` and
`/index` list `server.links`; `/robots.txt` is a 404. `EXPECTED` is the reason a fetcher
should record for each kind (None: it answers a page). Nothing here contacts a public
address.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import functools
import gzip
import os
import socket
import ssl
import struct
import tempfile
import zlib
from collections import Counter
from collections.abc import Awaitable, Callable
from pathlib import Path

import brotli

from ..crawl.errors import Reason

Handler = Callable[
    ["HostileServer", asyncio.StreamReader, asyncio.StreamWriter, str], Awaitable[bool]
]

DEFAULT_NAME = "hostile.test"
#: How much zeros a compression bomb inflates to.
DEFAULT_BOMB_BYTES = 1 << 30
TLS_KINDS = ("tls-untrusted", "tls-expired", "tls-wrong-host", "tls-plain")

#: What a fetcher with a total timeout and a size cap below the bombs' should record.
EXPECTED: dict[str, Reason | None] = {
    "ok": None,
    "slow-drip": Reason.TIMEOUT,  # a byte every `drip` seconds, forever
    "slowloris": Reason.TIMEOUT,  # the headers, a byte at a time, forever
    "stall": Reason.TIMEOUT,  # reads the request, never answers
    "endless": Reason.TOO_LARGE,  # a chunked body that never ends
    "huge-length": Reason.TOO_LARGE,  # Content-Length of a petabyte, then a body forever
    "gzip-bomb": Reason.TOO_LARGE,  # ~1 MB gzip of 1 GiB of zeros
    "deflate-bomb": Reason.TOO_LARGE,
    "gzip-gzip-bomb": Reason.TOO_LARGE,  # gzip, gzip: a bomb inside a bomb
    "chunked-gzip-bomb": Reason.TOO_LARGE,  # the gzip bomb, chunked, no Content-Length
    "br-bomb": Reason.TOO_LARGE,
    "redirect-loop": Reason.REDIRECT_LOOP,  # a -> b -> a
    "redirect-chain": Reason.TOO_MANY_REDIRECTS,  # 1 -> 2 -> 3 -> ... forever
    "slow-redirect": Reason.TIMEOUT,  # each hop answers just before the read timeout
    "bad-status": Reason.BAD_RESPONSE,  # "HTTP/1.1 2OO OK"
    "garbage": Reason.BAD_RESPONSE,  # bytes that are not HTTP at all
    "bad-length": Reason.BAD_RESPONSE,  # Content-Length: lots
    "short-body": Reason.BROKEN_BODY,  # Content-Length promises more than is sent
    "long-body": Reason.BAD_RESPONSE,  # more than Content-Length says, on a kept-alive line
    "bad-chunk": Reason.BAD_RESPONSE,  # a chunk size that is not hex
    "bad-location": Reason.BAD_RESPONSE,  # a redirect to "http://[oops/"
    "file-location": Reason.BAD_RESPONSE,  # a redirect to file:///etc/passwd
    "odd-headers": None,  # header values in Latin-1 and with control characters: a page
    "binary-html": Reason.BAD_ENCODING,  # random bytes as text/html
    "huge-header": Reason.BAD_RESPONSE,  # one header of 1 MB
    "many-headers": Reason.BAD_RESPONSE,  # 10,000 headers
    "reset": Reason.BROKEN_BODY,  # a TCP reset in the middle of the body
    "empty": Reason.NETWORK,  # the connection closed without a byte of answer
    "tls-untrusted": Reason.TLS,  # a certificate from a CA nobody trusts
    "tls-expired": Reason.TLS,  # from the trusted CA, expired
    "tls-wrong-host": Reason.TLS,  # from the trusted CA, for another name
    "tls-plain": Reason.TLS,  # https to the plain-HTTP port
}

_CHUNK = 64 * 1024
_HTML = b"<!doctype html><html><head><title>%s</title></head><body>%s</body></html>"


def _head(status: str, headers: list[tuple[str, str | int]]) -> bytes:
    lines = [f"HTTP/1.1 {status}", *(f"{name}: {value}" for name, value in headers)]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


_BLOCK = 1 << 20


@functools.cache
def _deflated_zeros(size: int) -> tuple[bytes, int]:
    """A raw deflate stream of `size` zero bytes (a multiple of 1 MiB, rounded down) and the
    size: one block compressed after a full flush is the same every time, so it is repeated
    instead of compressing a gigabyte."""
    compressor = zlib.compressobj(9, zlib.DEFLATED, -zlib.MAX_WBITS)
    block = compressor.compress(bytes(_BLOCK)) + compressor.flush(zlib.Z_FULL_FLUSH)
    count = max(1, size // _BLOCK)
    return block * count + compressor.flush(zlib.Z_FINISH), count * _BLOCK


@functools.cache
def bomb(coding: str, size: int) -> bytes:
    """`size` zero bytes compressed with `coding`: gzip, deflate, br, or "gzip, gzip"."""
    if coding == "gzip, gzip":
        return gzip.compress(bomb("gzip", size), 9)
    if coding == "br":
        compressor = brotli.Compressor(quality=1)
        parts = [compressor.process(bytes(_BLOCK)) for _ in range(max(1, size // _BLOCK))]
        return b"".join(parts) + bytes(compressor.finish())
    stream, inflated = _deflated_zeros(size)
    if coding == "deflate":  # zlib-wrapped, with its Adler-32 of the zeros
        adler = 1
        for _ in range(inflated // _BLOCK):
            adler = zlib.adler32(bytes(_BLOCK), adler)
        return b"\x78\xda" + stream + struct.pack(">I", adler)
    crc = 0
    for _ in range(inflated // _BLOCK):
        crc = zlib.crc32(bytes(_BLOCK), crc)
    header = b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x02\xff"
    return header + stream + struct.pack("<II", crc, inflated & 0xFFFFFFFF)


def _abort(writer: asyncio.StreamWriter) -> None:
    """Closes with a TCP reset instead of a FIN."""
    sock = writer.get_extra_info("socket")
    if sock is not None:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()


class HostileServer:
    """`async with HostileServer(host) as server:`; `server.hits` counts requests per kind;
    `server.connections` counts the connections accepted (TLS ports included). Drips send a
    byte every `drip` seconds; slow redirects wait `hop_delay` seconds before each hop (set
    it below the read timeout and above a tenth of the total one)."""

    def __init__(
        self,
        host: str = "127.0.0.1",
        *,
        name: str = DEFAULT_NAME,
        drip: float = 0.05,
        hop_delay: float = 0.5,
        bomb_bytes: int = DEFAULT_BOMB_BYTES,
        tls: bool = True,
    ) -> None:
        self.host = host
        self.name = name
        self.drip = drip
        self.hop_delay = hop_delay
        self.bomb_bytes = bomb_bytes
        self.tls = tls
        self.port = 0
        self.tls_ports: dict[str, int] = {}
        self.links: list[str] = []
        self.hits: Counter[str] = Counter()
        self.connections = 0
        self._servers: list[asyncio.Server] = []
        self._writers: set[asyncio.StreamWriter] = set()
        self._tasks: set[asyncio.Task[None]] = set()
        self._closing = asyncio.Event()
        self._tmp: tempfile.TemporaryDirectory[str] | None = None
        self.ca_file: str | None = None

    @property
    def resolve(self) -> dict[str, str]:
        return {self.name: self.host}

    @property
    def kinds(self) -> list[str]:
        """Every kind this server serves."""
        return [k for k in EXPECTED if k not in TLS_KINDS or self.tls]

    def url(self, kind: str, n: int = 0, *, host: str | None = None) -> str:
        name = host or self.name
        if kind == "tls-plain":
            return f"https://{name}:{self.port}/ok/{n}"
        if kind in TLS_KINDS:
            return f"https://{name}:{self.tls_ports[kind]}/ok/{n}"
        return f"http://{name}:{self.port}/{kind}/{n}"

    async def __aenter__(self) -> HostileServer:
        for coding in (
            "gzip",
            "deflate",
            "gzip, gzip",
            "br",
        ):  # ready before the first request, which must not wait
            await asyncio.to_thread(bomb, coding, self.bomb_bytes)
        plain = await asyncio.start_server(self._accept, self.host, 0, limit=_CHUNK)
        self._servers.append(plain)
        self.port = plain.sockets[0].getsockname()[1]
        if self.tls:
            for kind, context in self._tls_contexts().items():
                server = await asyncio.start_server(
                    self._accept, self.host, 0, ssl=context, limit=_CHUNK
                )
                self._servers.append(server)
                self.tls_ports[kind] = server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc: object) -> None:
        for server in self._servers:
            server.close()
        self._closing.set()  # handlers return (cancelling them upsets asyncio's streams)
        for writer in list(self._writers):
            writer.transport.abort()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        for server in self._servers:
            await server.wait_closed()
        if self._tmp is not None:
            self._tmp.cleanup()

    def _tls_contexts(self) -> dict[str, ssl.SSLContext]:
        import trustme

        trusted, stranger = trustme.CA(), trustme.CA()
        self._tmp = tempfile.TemporaryDirectory(prefix="crawlq-hostile-")
        self.ca_file = str(Path(self._tmp.name) / "ca.pem")
        trusted.cert_pem.write_to_path(self.ca_file)
        names = (self.name, self.host)
        past = datetime.datetime.now(datetime.UTC) - datetime.timedelta(days=30)
        certs = {
            "tls-untrusted": stranger.issue_cert(*names),
            "tls-expired": trusted.issue_cert(
                *names, not_before=past - datetime.timedelta(days=365), not_after=past
            ),
            "tls-wrong-host": trusted.issue_cert("elsewhere.test"),
        }
        contexts = {}
        for kind, cert in certs.items():
            context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
            cert.configure_cert(context)
            contexts[kind] = context
        return contexts

    # -- serving ------------------------------------------------------------------------------

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        self._writers.add(writer)
        self.connections += 1
        try:
            while await self._one(reader, writer):
                pass
        except (ConnectionError, asyncio.IncompleteReadError, asyncio.LimitOverrunError):
            pass
        except ssl.SSLError:
            pass
        finally:
            self._tasks.discard(task)
            self._writers.discard(writer)
            if not writer.transport.is_closing():
                writer.close()
            with contextlib.suppress(ConnectionError, ssl.SSLError):
                await writer.wait_closed()

    async def _one(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
        """Serves one request; True to read another on this connection."""
        first = await reader.read(1)
        if not first:
            return False
        if first == b"\x16":  # a TLS ClientHello on the plain port
            self.hits["tls-plain"] += 1
            writer.write(_head("400 Bad Request", [("Content-Length", 0)]))
            await writer.drain()
            return False
        head = first + await reader.readuntil(b"\r\n\r\n")
        request_line = head.split(b"\r\n", 1)[0].decode("latin-1")
        parts = request_line.split(" ")
        path = parts[1] if len(parts) >= 2 else "/"
        kind = path.strip("/").split("/", 1)[0] or "index"
        handler = _HANDLERS.get(kind, _not_found)
        self.hits[kind if kind in _HANDLERS else "other"] += 1
        keep = await handler(self, reader, writer, path)
        return keep and b"\r\nconnection: close" not in head.lower()

    async def _drip(self, writer: asyncio.StreamWriter, data: bytes) -> bool:
        """Sends `data` one byte every `drip` seconds, then holds the connection forever."""
        for index in range(len(data)):
            if self._closing.is_set():
                return False
            writer.write(data[index : index + 1])
            await writer.drain()
            await asyncio.sleep(self.drip)
        await self._closing.wait()
        return False

    async def _stream(self, writer: asyncio.StreamWriter, data: bytes) -> bool:
        """Sends `data` again and again, as fast as the client reads, until it leaves."""
        while not self._closing.is_set():
            writer.write(data)
            await writer.drain()
        return False


# -- the kinds ----------------------------------------------------------------------------------


async def _ok(s: HostileServer, r: asyncio.StreamReader, w: asyncio.StreamWriter, p: str) -> bool:
    body = _HTML % (b"ok", p.encode())
    headers: list[tuple[str, str | int]] = [("Content-Length", len(body))]
    w.write(_head("200 OK", [("Content-Type", "text/html; charset=utf-8"), *headers]) + body)
    await w.drain()
    return True


async def _index(
    s: HostileServer, r: asyncio.StreamReader, w: asyncio.StreamWriter, p: str
) -> bool:
    anchors = "".join(f'<a href="{link}">{link}</a>\n' for link in s.links).encode()
    body = _HTML % (b"hostile pages", anchors)
    headers: list[tuple[str, str | int]] = [
        ("Content-Type", "text/html; charset=utf-8"),
        ("Content-Length", len(body)),
    ]
    w.write(_head("200 OK", headers) + body)
    await w.drain()
    return True


async def _not_found(
    s: HostileServer, r: asyncio.StreamReader, w: asyncio.StreamWriter, p: str
) -> bool:
    w.write(_head("404 Not Found", [("Content-Length", 0)]))
    await w.drain()
    return True


async def _slow_drip(
    s: HostileServer, r: asyncio.StreamReader, w: asyncio.StreamWriter, p: str
) -> bool:
    w.write(_head("200 OK", [("Content-Type", "text/html"), ("Content-Length", 100_000)]))
    return await s._drip(w, b"<html>" + b"." * 99_994)


async def _slowloris(
    s: HostileServer, r: asyncio.StreamReader, w: asyncio.StreamWriter, p: str
) -> bool:
    return await s._drip(w, b"HTTP/1.1 200 OK\r\nX-Wait: " + b"z" * 10**6)


async def _stall(
    s: HostileServer, r: asyncio.StreamReader, w: asyncio.StreamWriter, p: str
) -> bool:
    await s._closing.wait()
    return False


async def _endless(
    s: HostileServer, r: asyncio.StreamReader, w: asyncio.StreamWriter, p: str
) -> bool:
    w.write(_head("200 OK", [("Content-Type", "text/html"), ("Transfer-Encoding", "chunked")]))
    piece = b"<p>" + b"more " * (_CHUNK // 5) + b"</p>"
    return await s._stream(w, b"%x\r\n%s\r\n" % (len(piece), piece))


async def _huge_length(
    s: HostileServer, r: asyncio.StreamReader, w: asyncio.StreamWriter, p: str
) -> bool:
    w.write(_head("200 OK", [("Content-Type", "text/html"), ("Content-Length", 10**15)]))
    return await s._stream(w, b"x" * _CHUNK)


def _bomb_kind(coding: str, *, chunked: bool = False) -> Handler:
    async def handler(
        s: HostileServer, r: asyncio.StreamReader, w: asyncio.StreamWriter, p: str
    ) -> bool:
        data = await asyncio.to_thread(bomb, coding, s.bomb_bytes)
        headers: list[tuple[str, str | int]] = [
            ("Content-Type", "text/html"),
            ("Content-Encoding", coding),
        ]
        if chunked:
            w.write(_head("200 OK", [*headers, ("Transfer-Encoding", "chunked")]))
            for start in range(0, len(data), _CHUNK):
                piece = data[start : start + _CHUNK]
                w.write(b"%x\r\n%s\r\n" % (len(piece), piece))
                await w.drain()
            w.write(b"0\r\n\r\n")
        else:
            w.write(_head("200 OK", [*headers, ("Content-Length", len(data))]) + data)
        await w.drain()
        return True

    return handler


def _redirect(location: str) -> bytes:
    return _head("302 Found", [("Location", location), ("Content-Length", 0)])


async def _redirect_loop(
    s: HostileServer, r: asyncio.StreamReader, w: asyncio.StreamWriter, p: str
) -> bool:
    w.write(_redirect(p[: -len("/again")] if p.endswith("/again") else p + "/again"))
    await w.drain()
    return True


async def _slow_redirect(
    s: HostileServer, r: asyncio.StreamReader, w: asyncio.StreamWriter, p: str
) -> bool:
    await asyncio.sleep(s.hop_delay)
    return await _redirect_chain(s, r, w, p)


async def _redirect_chain(
    s: HostileServer, r: asyncio.StreamReader, w: asyncio.StreamWriter, p: str
) -> bool:
    w.write(_redirect(p + "/on"))
    await w.drain()
    return True


def _raw(answer: bytes, *, keep: bool = False) -> Handler:
    async def handler(
        s: HostileServer, r: asyncio.StreamReader, w: asyncio.StreamWriter, p: str
    ) -> bool:
        w.write(answer)
        await w.drain()
        return keep

    return handler


async def _reset(
    s: HostileServer, r: asyncio.StreamReader, w: asyncio.StreamWriter, p: str
) -> bool:
    w.write(_html_head(100_000) + b"<html>" + b"." * 10_000)
    await w.drain()
    await asyncio.sleep(0.05)  # let the client start reading the body
    _abort(w)
    return False


async def _odd_headers(
    s: HostileServer, r: asyncio.StreamReader, w: asyncio.StreamWriter, p: str
) -> bool:
    body = _HTML % (b"odd headers", b"fine")
    w.write(
        b"HTTP/1.1 200 \xc7a va\r\n"
        b"Content-Type: text/html; charset=utf-8\r\n"
        b"X-Latin: caf\xe9 \xff\xfe\r\n"
        b"X-Tab: a\tb\r\n"
        b"Set-Cookie: weird=\x80\x81; Path=/\r\n"
        b"Content-Length: %d\r\n\r\n%s" % (len(body), body)
    )
    await w.drain()
    return True


def _long_body() -> bytes:
    body = _HTML % (b"long", b"." * 50)
    headers: list[tuple[str, str | int]] = [
        ("Content-Type", "text/html; charset=utf-8"),
        ("Content-Length", len(body)),
        ("Connection", "keep-alive"),
    ]
    # What follows the promised body would be read as the next response, if anyone reused
    # this connection: a poisoned keep-alive.
    trailer = _head("200 OK", [("Content-Length", 8)]) + b"poisoned" + b"x" * 50_000
    return _head("200 OK", headers) + body + trailer


def _html_head(length: int) -> bytes:
    return _head("200 OK", [("Content-Type", "text/html"), ("Content-Length", length)])


_HANDLERS: dict[str, Handler] = {
    "index": _index,
    "ok": _ok,
    "slow-drip": _slow_drip,
    "slowloris": _slowloris,
    "stall": _stall,
    "endless": _endless,
    "huge-length": _huge_length,
    "gzip-bomb": _bomb_kind("gzip"),
    "deflate-bomb": _bomb_kind("deflate"),
    "gzip-gzip-bomb": _bomb_kind("gzip, gzip"),
    "chunked-gzip-bomb": _bomb_kind("gzip", chunked=True),
    "br-bomb": _bomb_kind("br"),
    "redirect-loop": _redirect_loop,
    "redirect-chain": _redirect_chain,
    "slow-redirect": _slow_redirect,
    "bad-status": _raw(_head("2OO OK", [("Content-Length", 0)])),
    "garbage": _raw(b"\x00\xffSSH-2.0-OpenSSH_9.9 not http at all\r\n\r\n"),
    "bad-length": _raw(_head("200 OK", [("Content-Length", "lots")]) + b"body"),
    "short-body": _raw(_html_head(100_000) + b"<html>" + b"." * 1000),
    "long-body": _raw(_long_body(), keep=True),
    "binary-html": _raw(_html_head(512 * 1024) + os.urandom(512 * 1024), keep=True),
    "huge-header": _raw(_head("200 OK", [("X-Huge", "h" * 2**20), ("Content-Length", 0)])),
    "many-headers": _raw(
        _head("200 OK", [*((f"X-H{n}", n) for n in range(10_000)), ("Content-Length", 0)])
    ),
    "reset": _reset,
    "bad-chunk": _raw(
        _head("200 OK", [("Content-Type", "text/html"), ("Transfer-Encoding", "chunked")])
        + b"zz\r\nhello\r\n0\r\n\r\n"
    ),
    "bad-location": _raw(_redirect("http://[oops/")),
    "file-location": _raw(_redirect("file:///etc/passwd")),
    "odd-headers": _odd_headers,
    "empty": _raw(b""),
}
