"""A small HTTP forward proxy on loopback: it logs each request, resolves the host with a
static map, and forwards each request on a connection of its own to the site; clients may
keep their connection to the proxy open for many requests. `CONNECT host:port` (what a
client sends for an https:// URL) opens a tunnel to the site: the proxy relays the bytes
both ways and sees neither the URLs nor the pages inside, which stay encrypted.

Targets are checked before anything is sent: a name must be in the resolve map (the proxy
never asks DNS) and its address, or a literal one, inside `allow` (loopback by default);
anything else is answered 403 and noted in `refused`."""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
from collections.abc import Iterable, Mapping
from urllib.parse import urlsplit

HOP_BY_HOP = frozenset(
    {"connection", "keep-alive", "proxy-connection", "proxy-authorization", "te", "upgrade"}
)
#: Bytes a tunnel reads from one side before it has written them to the other.
TUNNEL_CHUNK = 64 * 1024
#: Seconds to connect to a site before answering 502.
CONNECT_TIMEOUT = 10.0

FORBIDDEN = b"HTTP/1.1 403 Forbidden\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
BAD_GATEWAY = b"HTTP/1.1 502 Bad Gateway\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
BAD_REQUEST = b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"


class ForwardProxy:
    """`async with ForwardProxy(resolve) as proxy:` then `proxy.url`; `proxy.requests` lists
    every request it passed on: the absolute URL of a forwarded one, `CONNECT host:port` for
    a tunnel (the requests inside are the site's to count). With `egress`, connections to
    the sites leave from that local address (a fixed egress IP the sites can check).
    `allow` lists the networks it may connect to; `refused` lists the targets it would not."""

    def __init__(
        self,
        resolve: Mapping[str, str],
        host: str = "127.0.0.1",
        *,
        egress: str | None = None,
        allow: Iterable[str] = ("127.0.0.0/8", "::1/128"),
    ) -> None:
        if not ipaddress.ip_address(host).is_loopback:
            raise ValueError(f"the test proxy listens on loopback only, not {host}")
        self.resolve = {name.lower(): address for name, address in resolve.items()}
        self.host = host
        self.egress = egress
        self.allow = tuple(ipaddress.ip_network(network) for network in allow)
        self.port = 0
        self.requests: list[str] = []
        self.refused: list[str] = []
        self._server: asyncio.Server | None = None
        self._handlers: set[asyncio.Task[None]] = set()  # one per client connection
        self._streams: set[asyncio.StreamWriter] = set()  # every connection open, both sides

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    async def __aenter__(self) -> ForwardProxy:
        self._server = await asyncio.start_server(self._serve, self.host, 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._server is not None:
            self._server.close()
            # Kept-alive connections and open tunnels: cut, so that their handlers end (and
            # close what they opened) on their own; cancelled, they would upset asyncio.
            for stream in list(self._streams):
                stream.transport.abort()
            await asyncio.gather(*self._handlers, return_exceptions=True)
            await self._server.wait_closed()

    def _address(self, host: str) -> str | None:
        """Where `host` may be reached, or None (noted in `refused`) if it may not."""
        address = self.resolve.get(host.lower(), host)
        try:
            allowed = any(ipaddress.ip_address(address) in net for net in self.allow)
        except ValueError:
            allowed = False  # a name not in the map: never looked up
        if not allowed:
            self.refused.append(host)
            return None
        return address

    async def _connect(
        self, address: str, port: int
    ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        local = (self.egress, 0) if self.egress else None
        connecting = asyncio.open_connection(address, port, local_addr=local)
        reader, writer = await asyncio.wait_for(connecting, CONNECT_TIMEOUT)
        self._streams.add(writer)
        return reader, writer

    async def _close(self, writer: asyncio.StreamWriter) -> None:
        self._streams.discard(writer)
        writer.close()
        with contextlib.suppress(ConnectionError):
            await writer.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        handler = asyncio.current_task()
        assert handler is not None
        self._handlers.add(handler)
        self._streams.add(writer)
        try:
            while await self._forward(reader, writer):
                pass
        except (ConnectionError, asyncio.IncompleteReadError, asyncio.LimitOverrunError):
            pass
        except ValueError:
            writer.write(BAD_REQUEST)  # not HTTP
        finally:
            await self._close(writer)
            self._handlers.discard(handler)

    async def _forward(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
        """Forwards one request; True if the client's connection stays open for another."""
        try:
            head = await reader.readuntil(b"\r\n\r\n")
        except asyncio.IncompleteReadError as exc:
            if exc.partial:
                raise
            return False  # the client closed between requests
        request_line, *header_lines = head.decode("latin-1").split("\r\n")
        method, target, version = request_line.split(" ", 2)
        if method == "CONNECT":
            await self._tunnel(target, reader, writer)
            return False  # the connection was the tunnel's
        headers = [line.split(":", 1) for line in header_lines if ":" in line]
        length = next((int(v) for k, v in headers if k.strip().lower() == "content-length"), 0)
        body = await reader.readexactly(length) if length else b""
        parts = urlsplit(target)
        if parts.scheme != "http" or not parts.hostname:
            writer.write(b"HTTP/1.1 501 Not Implemented\r\nConnection: close\r\n\r\n")
            return False
        address = self._address(parts.hostname)
        if address is None:
            writer.write(FORBIDDEN)
            return False
        wants_close = version == "HTTP/1.0" or any(
            k.strip().lower() in ("connection", "proxy-connection") and v.strip().lower() == "close"
            for k, v in headers
        )
        self.requests.append(target)
        try:
            upstream_reader, upstream_writer = await self._connect(address, parts.port or 80)
        except OSError:
            writer.write(BAD_GATEWAY)
            return False
        try:
            path = parts.path or "/"
            if parts.query:
                path += "?" + parts.query
            kept = [
                (k.strip(), v.strip()) for k, v in headers if k.strip().lower() not in HOP_BY_HOP
            ]
            lines = [f"{method} {path} {version}", *(f"{k}: {v}" for k, v in kept)]
            lines.append("Connection: close")
            upstream_writer.write(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body)
            await upstream_writer.drain()
            answer_head = await upstream_reader.readuntil(b"\r\n\r\n")
            answer_body = await upstream_reader.read()  # the site closes: the body ends there
        finally:
            await self._close(upstream_writer)
        status_line, *answer_lines = answer_head.decode("latin-1").split("\r\n")
        answer = [
            line
            for line in answer_lines
            if line and line.split(":", 1)[0].strip().lower() not in HOP_BY_HOP
        ]
        chunked = any(
            line.split(":", 1)[0].strip().lower() == "transfer-encoding" for line in answer
        )
        if not chunked and method != "HEAD":
            # the client needs the body's end marked to keep its connection: give its length
            answer = [
                line for line in answer if line.split(":", 1)[0].strip().lower() != "content-length"
            ]
            answer.append(f"Content-Length: {len(answer_body)}")
        keep = not wants_close
        answer.append("Connection: keep-alive" if keep else "Connection: close")
        writer.write(("\r\n".join([status_line, *answer]) + "\r\n\r\n").encode("latin-1"))
        writer.write(answer_body)
        await writer.drain()
        return keep

    async def _tunnel(
        self, target: str, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        """Answers `CONNECT target` (`host:port`): relays bytes between the client and the
        site until either side closes, then closes both."""
        parts = urlsplit("//" + target)
        try:
            port = parts.port
        except ValueError:
            port = None
        if not parts.hostname or port is None:
            writer.write(BAD_REQUEST)
            return
        address = self._address(parts.hostname)
        if address is None:
            writer.write(FORBIDDEN)
            return
        self.requests.append(f"CONNECT {target}")
        try:
            site_reader, site_writer = await self._connect(address, port)
        except OSError:
            writer.write(BAD_GATEWAY)
            return
        writer.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
        relays = [
            asyncio.create_task(_relay(reader, site_writer), name=f"proxy-to-{target}"),
            asyncio.create_task(_relay(site_reader, writer), name=f"proxy-from-{target}"),
        ]
        try:
            await asyncio.wait(relays, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for relay in relays:
                relay.cancel()
            await asyncio.gather(*relays, return_exceptions=True)
            await self._close(site_writer)


async def _relay(source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
    """Copies `source` to `sink` until `source` ends, TUNNEL_CHUNK bytes at most in hand."""
    while chunk := await source.read(TUNNEL_CHUNK):
        sink.write(chunk)
        await sink.drain()
