"""A synthetic web: many sites, each on its own loopback address (127.0.1.1, 127.0.1.2...,
127.0.1.254, then 127.0.2.1...), so each is its own politeness group; a static resolve map
lets names like site1.test reach them. Pages link to each other (every page reachable from
/page/0), robots.txt, latency, injected errors and custom routes per site; every request is
logged with its arrival and end time, so tests and benchmarks can check politeness from the
server's side.

What is stamped (epoch seconds, `time.time()` in the server's event loop):
- `Hit.at`, the arrival: the kernel's receive time (SO_TIMESTAMPNS) of the first bytes of
  the request read from its connection after the previous request on it was answered:
  when its packet entered the server host's network stack, before the server process was
  scheduled, its loop turned or its handler was dispatched, none of which delays it. Where
  the system gives no such time, the loop's time of that read (`data_received`, before any
  parsing or dispatch).
- `Hit.ended`, the end: when the handler's answer was ready, before it is written.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hashlib
import ipaddress
import random
import socket
import string
import struct
import time
from collections import defaultdict
from collections.abc import Awaitable, Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Protocol

from aiohttp import web

Route = Callable[[web.Request], Awaitable[web.StreamResponse]]

FIRST_ADDRESS = (127, 0, 1, 1)


@dataclass(kw_only=True)
class Hit:
    host: str
    method: str
    path: str  # with the query
    at: float  # epoch seconds, when the server first read bytes of the request
    peer: str  # the client's address
    headers: dict[str, str]
    cookies: dict[str, str]
    ended: float | None = None  # when the answer was ready
    status: int | None = None  # of the answer (None: the handler raised)
    retry_after: str | None = None  # the answer's Retry-After header, if any
    port: int | None = None  # the client's port: with `peer`, its connection


class Logged(Protocol):
    """A request as a server's log has it: its host, when it arrived and was answered."""

    @property
    def host(self) -> str: ...

    @property
    def at(self) -> float: ...

    @property
    def ended(self) -> float | None: ...


def peak_in_flight(hits: Iterable[Logged]) -> dict[str, int]:
    """Per host, the most requests in flight at once, from the log's times alone (a request
    never answered stays in flight)."""
    events: dict[str, list[tuple[float, int]]] = defaultdict(list)
    for hit in hits:
        events[hit.host].append((hit.at, 1))
        events[hit.host].append((hit.ended if hit.ended is not None else float("inf"), -1))
    peaks = {}
    for host, changes in events.items():
        current = peak = 0
        for _, change in sorted(changes):
            current += change
            peak = max(peak, current)
        peaks[host] = peak
    return peaks


@dataclass(kw_only=True)
class Site:
    """`pages` pages at /page/0 .. /page/{pages-1}; page n links to n+1, 2n+1 and 2n+2 (of
    those that exist) and page 0 to each of `cross_links` (absolute URLs). `robots` is the
    robots.txt body (None: 404). A fraction `flaky` of the pages fail their first request
    with 500, 429 or 503 (the last two with Retry-After `retry_after`). `routes` override any
    path.

    Pages as real sites write them, when asked: `links` more links a page to other pages of
    the site (spread over them, written root-relative, relative, with a dot segment,
    absolute, with a fragment, and to the page's own sections), and about `text` bytes of
    text."""

    name: str
    pages: int = 10
    robots: str | None = None
    latency: float = 0.0
    flaky: float = 0.0
    retry_after: int = 1
    cross_links: list[str] = field(default_factory=list)
    routes: dict[str, Route] = field(default_factory=dict)
    links: int = 0
    text: int = 0


def _fraction(text: str) -> float:
    digest = hashlib.blake2b(text.encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2**64


@functools.cache
def filler(size: int) -> str:
    """About `size` bytes of paragraphs of made-up words (the same for a size: built once)."""
    rng = random.Random(size)
    vocabulary = [
        "".join(rng.choices(string.ascii_lowercase, k=rng.randint(2, 9))) for _ in range(400)
    ]
    paragraphs, length = [], 0
    while length < size:
        paragraph = "<p>" + " ".join(rng.choices(vocabulary, k=60)) + "</p>\n"
        paragraphs.append(paragraph)
        length += len(paragraph)
    return "".join(paragraphs)


def more_links(number: int, pages: int, count: int, origin: str) -> list[str]:
    """`count` links from page `number` to others of its site, spread over all of them, in
    the forms real pages use; `origin` is scheme://host:port."""
    written = []
    for k in range(count):
        target = (number * 7919 + k * 104729) % pages
        form = k % 6
        if form == 0:
            written.append(f"/page/{target}")
        elif form == 1:
            written.append(str(target))  # relative to /page/
        elif form == 2:
            written.append(f"../page/{target}")
        elif form == 3:
            written.append(f"{origin}/page/{target}")
        elif form == 4:
            written.append(f"/page/{target}#part-{k % 7}")
        else:
            written.append(f"#section-{k % 9}")
    return written


def page_html(title: str, links: list[str], body: str = "") -> str:
    anchors = "".join(f'<li><a href="{link}">{link}</a></li>' for link in links)
    return (
        f"<!doctype html><html><head><title>{title}</title></head>"
        f"<body><h1>{title}</h1>{body}<ul>{anchors}</ul></body></html>"
    )


def respond(
    status: int = 200,
    body: str | bytes = "",
    *,
    content_type: str = "text/html; charset=utf-8",
    headers: dict[str, str] | None = None,
) -> Route:
    async def handler(request: web.Request) -> web.StreamResponse:
        data = body.encode() if isinstance(body, str) else body
        answer = web.Response(status=status, body=data, headers=headers)
        answer.headers["Content-Type"] = content_type
        return answer

    return handler


def redirect(location: str, status: int = 302) -> Route:
    return respond(status, "", headers={"Location": location})


def hang(release: asyncio.Event) -> Route:
    """Answers only once `release` is set: a request that times out, deterministically."""

    async def handler(request: web.Request) -> web.StreamResponse:
        await release.wait()
        return web.Response(text="too late")

    return handler


#: Linux: each read of a socket with this option set comes with the kernel's receive time of
#: its data (struct timespec), taken as the packet entered the host's network stack.
SO_TIMESTAMPNS = 35
_TIMESPEC = struct.Struct("qq")


class _StampingSocket(socket.socket):
    """An accepted connection whose reads note the kernel's receive time of their data
    (`received`, epoch seconds; None where the system gives none)."""

    received: float | None = None

    def recv(self, bufsize: int, flags: int = 0) -> bytes:
        data, ancillary, _, _ = self.recvmsg(bufsize, socket.CMSG_SPACE(_TIMESPEC.size), flags)
        self.received = _kernel_time(ancillary)
        return data


def _kernel_time(ancillary: list[tuple[int, int, bytes]]) -> float | None:
    for level, kind, raw in ancillary:
        if level == socket.SOL_SOCKET and kind == SO_TIMESTAMPNS:
            seconds, nanoseconds = _TIMESPEC.unpack(raw[: _TIMESPEC.size])
            return float(seconds + nanoseconds / 1e9)
    return None


async def kernel_stamps(timeout: float = 5.0) -> bool:
    """Waits until the kernel stamps the TCP data it receives, which it starts doing a moment
    after a socket first asks (a deferred switch); False if it does not within `timeout`."""
    with socket.create_server(("127.0.0.1", 0)) as listener:
        listener.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
        with socket.create_connection(listener.getsockname()) as client:
            server, _ = listener.accept()
            with server:
                server.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
                deadline = time.monotonic() + timeout
                while True:
                    client.sendall(b"?")
                    _, ancillary, _, _ = server.recvmsg(16, socket.CMSG_SPACE(_TIMESPEC.size))
                    if _kernel_time(ancillary) is not None:
                        return True
                    if time.monotonic() > deadline:
                        return False
                    await asyncio.sleep(0.005)


class _Stamped(asyncio.Protocol):
    """aiohttp's protocol for one connection, noting in `arrivals` when the bytes of each
    request on it arrived: the kernel's receive time of the first read since the previous
    request was answered (the loop's time of that read where there is none). The handler
    takes the stamp, and clears it once it has answered."""

    def __init__(
        self, inner: asyncio.Protocol, sock: _StampingSocket, arrivals: dict[object, float]
    ) -> None:
        self.inner = inner
        self.sock = sock
        self.arrivals = arrivals
        self.transport: asyncio.BaseTransport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport
        self.inner.connection_made(transport)

    def data_received(self, data: bytes) -> None:
        if self.transport not in self.arrivals:
            now = time.time()
            kernel = self.sock.received
            self.arrivals[self.transport] = now if kernel is None else min(kernel, now)
        self.inner.data_received(data)

    def eof_received(self) -> bool | None:
        return self.inner.eof_received()

    def connection_lost(self, exc: Exception | None) -> None:
        self.arrivals.pop(self.transport, None)
        self.inner.connection_lost(exc)

    def pause_writing(self) -> None:
        self.inner.pause_writing()

    def resume_writing(self) -> None:
        self.inner.resume_writing()


class _StampedSite(web.SockSite):
    """A SockSite accepting its connections itself, as `_StampingSocket`s served through
    `_Stamped`, so each request's arrival is the kernel's receive time of its bytes."""

    def __init__(
        self, runner: web.AppRunner, sock: socket.socket, arrivals: dict[object, float]
    ) -> None:
        super().__init__(runner, sock)
        self._arrivals = arrivals
        self._connecting: set[asyncio.Task[None]] = set()

    async def start(self) -> None:
        await web.BaseSite.start(self)  # registers the site with its runner
        self._sock.setblocking(False)
        with contextlib.suppress(OSError):  # set before any connection: the kernel stamps
            self._sock.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)  # from then on
        self._sock.listen(128)
        asyncio.get_running_loop().add_reader(self._sock.fileno(), self._accept)

    def _accept(self) -> None:
        server = self._runner.server
        assert server is not None
        loop = asyncio.get_running_loop()
        while True:
            try:
                accepted, _ = self._sock.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                return  # out of descriptors, a connection reset before accept: the client retries
            conn = _StampingSocket(fileno=accepted.detach())
            conn.setblocking(False)
            with contextlib.suppress(OSError):
                conn.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
            task = loop.create_task(self._connect(_Stamped(server(), conn, self._arrivals)))
            self._connecting.add(task)
            task.add_done_callback(self._connecting.discard)

    async def _connect(self, protocol: _Stamped) -> None:
        loop = asyncio.get_running_loop()
        await loop.connect_accepted_socket(lambda: protocol, protocol.sock)

    async def stop(self) -> None:
        asyncio.get_running_loop().remove_reader(self._sock.fileno())
        await super().stop()


def site_addresses(first: str) -> Iterator[str]:
    """Consecutive addresses from `first`, leaving out those ending in .0 and .255."""
    address = ipaddress.IPv4Address(first)
    while True:
        if address.packed[3] not in (0, 255):
            yield str(address)
        address += 1


class SyntheticWeb:
    """`async with SyntheticWeb([Site(name="a.test"), ...]) as net:`; then `net.url(name,
    path)`, `net.resolve` (for FetchSettings), `net.hits`."""

    def __init__(self, sites: list[Site], *, first_address: int = FIRST_ADDRESS[3]) -> None:
        self.sites = {site.name: site for site in sites}
        self.first_address = first_address  # last octet of the first site's address
        self.hits: list[Hit] = []
        self.addresses: dict[str, str] = {}
        self.ports: dict[str, int] = {}
        self._served: dict[str, int] = {}
        self._runner: web.AppRunner | None = None
        self._sockets: list[socket.socket] = []
        self._arrivals: dict[object, float] = {}  # transport -> its pending request's arrival

    @property
    def resolve(self) -> dict[str, str]:
        return dict(self.addresses)

    def url(self, name: str, path: str = "/page/0") -> str:
        return f"http://{name}:{self.ports[name]}{path}"

    def page_urls(self, name: str) -> list[str]:
        return [self.url(name, f"/page/{n}") for n in range(self.sites[name].pages)]

    def hits_for(self, name: str, *, pages_only: bool = False) -> list[Hit]:
        return [
            h for h in self.hits if h.host == name and not (pages_only and h.path == "/robots.txt")
        ]

    def peak_concurrency(self, name: str) -> int:
        return peak_in_flight(self.hits_for(name)).get(name, 0)

    async def __aenter__(self) -> SyntheticWeb:
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self._handle)
        self._runner = web.AppRunner(app, access_log=None, handle_signals=False)
        await self._runner.setup()
        first = ".".join(str(p) for p in (*FIRST_ADDRESS[:3], self.first_address))
        for name, address in zip(self.sites, site_addresses(first), strict=False):
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((address, 0))
            self._sockets.append(sock)
            self.addresses[name] = address
            self.ports[name] = sock.getsockname()[1]
            await _StampedSite(self._runner, sock, self._arrivals).start()
        with contextlib.suppress(OSError):
            await kernel_stamps()  # the sites asked for it: from now on, requests get it
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
        for sock in self._sockets:
            sock.close()

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        host = (request.url.host or "").lower()
        hit = Hit(
            host=host,
            method=request.method,
            path=request.path_qs,
            at=self._arrivals.get(request.transport, time.time()),
            peer=str(request.remote),
            port=_peer_port(request),
            headers=dict(request.headers),
            cookies=dict(request.cookies),
        )
        self.hits.append(hit)
        try:
            answer = await self._answer(request, host)
            hit.status = answer.status
            hit.retry_after = answer.headers.get("Retry-After")
            return answer
        finally:
            hit.ended = time.time()
            self._arrivals.pop(request.transport, None)  # the next request stamps afresh

    async def _answer(self, request: web.Request, host: str) -> web.StreamResponse:
        site = self.sites.get(host)
        if site is None:
            return web.Response(status=421, text=f"no site {host}")
        if site.latency:
            await asyncio.sleep(site.latency)
        route = site.routes.get(request.path_qs) or site.routes.get(request.path)
        if route is not None:
            return await route(request)
        if request.path == "/robots.txt":
            if site.robots is None:
                return web.Response(status=404, text="no robots.txt")
            return web.Response(text=site.robots, content_type="text/plain")
        prefix = "/page/"
        if not request.path.startswith(prefix) or not request.path[len(prefix) :].isdigit():
            return web.Response(status=404, text="not found")
        number = int(request.path[len(prefix) :])
        if number >= site.pages:
            return web.Response(status=404, text="not found")
        failure = self._injected(site, request.path)
        if failure is not None:
            return failure
        links = [f"/page/{n}" for n in (number + 1, 2 * number + 1, 2 * number + 2)]
        links = [link for link in links if int(link.rsplit("/", 1)[1]) < site.pages]
        if number == 0:
            links += site.cross_links
        if site.links:
            origin = f"{request.scheme}://{request.host}"
            links += more_links(number, site.pages, site.links, origin)
        title = f"{site.name} page {number}"
        body = filler(site.text)
        return web.Response(text=page_html(title, links, body), content_type="text/html")

    def _injected(self, site: Site, path: str) -> web.Response | None:
        key = f"{site.name}{path}"
        served = self._served.get(key, 0)
        self._served[key] = served + 1
        if served or not site.flaky or _fraction(key) >= site.flaky:
            return None
        kind = int(_fraction(key + "#kind") * 3)
        if kind == 0:
            return web.Response(status=500, text="injected error")
        status = 429 if kind == 1 else 503
        headers = {"Retry-After": str(site.retry_after)}
        return web.Response(status=status, text="slow down", headers=headers)


def _peer_port(request: web.Request) -> int | None:
    peer = request.transport.get_extra_info("peername") if request.transport else None
    return peer[1] if isinstance(peer, tuple) and len(peer) >= 2 else None
