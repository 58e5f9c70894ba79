"""A small HTTP forward proxy on loopback: it logs each request's absolute URL, resolves
the host with a static map, and forwards each request on a connection of its own to the
site; clients may keep their connection to the proxy open for many requests."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Mapping
from urllib.parse import urlsplit

HOP_BY_HOP = frozenset(
    {"connection", "keep-alive", "proxy-connection", "proxy-authorization", "te", "upgrade"}
)


class ForwardProxy:
    """`async with ForwardProxy(resolve) as proxy:` then `proxy.url`; `proxy.requests` lists
    every URL it forwarded. With `egress`, connections to the sites leave from that local
    address (a fixed egress IP the sites can check)."""

    def __init__(
        self, resolve: Mapping[str, str], host: str = "127.0.0.1", *, egress: str | None = None
    ) -> None:
        self.resolve = dict(resolve)
        self.host = host
        self.egress = egress
        self.port = 0
        self.requests: list[str] = []
        self._server: asyncio.Server | None = None

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
            await self._server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while await self._forward(reader, writer):
                pass
        except (ConnectionError, asyncio.IncompleteReadError, ValueError):
            pass
        finally:
            writer.close()
            with contextlib.suppress(ConnectionError):
                await writer.wait_closed()

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
        headers = [line.split(":", 1) for line in header_lines if ":" in line]
        length = next((int(v) for k, v in headers if k.strip().lower() == "content-length"), 0)
        body = await reader.readexactly(length) if length else b""
        parts = urlsplit(target)
        if parts.scheme != "http" or not parts.hostname:
            writer.write(b"HTTP/1.1 501 Not Implemented\r\nConnection: close\r\n\r\n")
            return False
        wants_close = version == "HTTP/1.0" or any(
            k.strip().lower() in ("connection", "proxy-connection") and v.strip().lower() == "close"
            for k, v in headers
        )
        self.requests.append(target)
        address = self.resolve.get(parts.hostname, parts.hostname)
        local = (self.egress, 0) if self.egress else None
        upstream_reader, upstream_writer = await asyncio.open_connection(
            address, parts.port or 80, local_addr=local
        )
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
            upstream_writer.close()
            with contextlib.suppress(ConnectionError):
                await upstream_writer.wait_closed()
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
