"""https:// through an http proxy: the fetcher asks the proxy to `CONNECT host:port`, then
speaks TLS to the site inside the tunnel. The sites here serve https on their own loopback
addresses with a certificate signed by a CA the test makes; the proxies connect to them
from egress addresses of their own, so a site's log shows which proxy every request it got
came through (the proxy itself sees only the tunnel, not the requests inside)."""

from __future__ import annotations

import asyncio
import socket
import ssl
import sys
from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import trustme
from aiohttp import web

from crawlq.crawl.crawler import PAGES_FILE
from crawlq.crawl.errors import FetchError, Reason
from crawlq.crawl.fetcher import Fetcher
from crawlq.crawl.records import read_records
from crawlq.crawl.settings import FetchSettings, Timeouts
from crawlq.crawl.testing import ForwardProxy
from crawlq.crawl.testing.sites import page_html

ADDRESS_PREFIX = "127.0.6."  # the sites: .1, .2, ...
EGRESS = ("127.0.6.101", "127.0.6.102")  # where each proxy connects to the sites from
PAGES = 5
BIG = bytes(range(256)) * (3 * 2**12)  # 3 MiB, every byte value in turn: /big
GUARD = 60.0  # seconds: only a failing test ever waits this long


@dataclass(frozen=True)
class Request:
    host: str
    path: str
    peer: str


class HttpsSites:
    """`async with HttpsSites(ca, ["a.test", ...]) as sites:` serves each name over https
    on an address of its own, with one certificate for all the names signed by `ca`. Page n
    of PAGES links to page n+1; /big is BIG; robots.txt is 404. `sites.requests` logs every
    request."""

    def __init__(self, ca: trustme.CA, names: list[str]) -> None:
        self.ca = ca
        self.addresses = {name: f"{ADDRESS_PREFIX}{i + 1}" for i, name in enumerate(names)}
        self.ports: dict[str, int] = {}
        self.requests: list[Request] = []
        self._runner: web.AppRunner | None = None

    def url(self, name: str, path: str = "/page/0", *, host: str | None = None) -> str:
        return f"https://{host or name}:{self.ports[name]}{path}"

    async def __aenter__(self) -> HttpsSites:
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        self.ca.issue_cert(*self.addresses).configure_cert(context)
        app = web.Application()
        app.router.add_get("/{tail:.*}", self._page)
        self._runner = web.AppRunner(app, access_log=None, handle_signals=False)
        await self._runner.setup()
        for address in self.addresses.values():
            await web.TCPSite(self._runner, address, 0, ssl_context=context).start()
        ports = {bound[0]: bound[1] for bound in self._runner.addresses}
        self.ports = {name: ports[address] for name, address in self.addresses.items()}
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    async def _page(self, request: web.Request) -> web.Response:
        host = request.host.rsplit(":", 1)[0]
        self.requests.append(Request(host, request.path, str(request.remote)))
        if request.path == "/big":
            return web.Response(body=BIG, content_type="application/octet-stream")
        number = request.path.removeprefix("/page/")
        if not number.isdigit() or int(number) >= PAGES:
            return web.Response(status=404, text="not found")
        links = [f"/page/{int(number) + 1}"] if int(number) + 1 < PAGES else []
        return web.Response(text=page_html(f"{host} {number}", links), content_type="text/html")


@pytest.fixture(scope="module")
def ca() -> trustme.CA:
    return trustme.CA()


@pytest.fixture
def ca_file(ca: trustme.CA, tmp_path: Path) -> str:
    path = tmp_path / "ca.pem"
    ca.cert_pem.write_to_path(str(path))
    return str(path)


@pytest.fixture
async def sites(ca: trustme.CA) -> AsyncIterator[HttpsSites]:
    """open.test (127.0.6.1), the site tests fetch; inner.test (127.0.6.2), one they may
    be refused."""
    async with HttpsSites(ca, ["open.test", "inner.test"]) as served:
        yield served


def fetcher(sites: HttpsSites, proxies: list[ForwardProxy], **options: Any) -> Fetcher:
    options.setdefault("resolve", sites.addresses)
    options.setdefault("allow_networks", ("127.0.0.0/8",))
    return Fetcher(
        FetchSettings(
            proxies=tuple(proxy.url for proxy in proxies),
            resolve_only=True,
            timeouts=Timeouts(connect=5, read=5, total=10),
            **options,
        )
    )


def tunnel(sites: HttpsSites, name: str) -> str:
    return f"CONNECT {name}:{sites.ports[name]}"


async def test_an_https_page_comes_through_a_connect_tunnel(
    sites: HttpsSites, ca_file: str
) -> None:
    async with (
        ForwardProxy(sites.addresses, egress=EGRESS[0]) as proxy,
        fetcher(sites, [proxy], ca_file=ca_file) as client,
    ):
        response = await client.fetch(sites.url("open.test"))
    assert response.status == 200
    assert b"<title>open.test 0</title>" in response.body
    assert proxy.requests and set(proxy.requests) == {tunnel(sites, "open.test")}
    assert sites.requests == [
        Request("open.test", "/robots.txt", EGRESS[0]),
        Request("open.test", "/page/0", EGRESS[0]),
    ]


async def test_a_large_body_comes_through_the_tunnel_intact(
    sites: HttpsSites, ca_file: str
) -> None:
    async with (
        ForwardProxy(sites.addresses) as proxy,
        fetcher(sites, [proxy], ca_file=ca_file) as client,
    ):
        response = await client.fetch(sites.url("open.test", "/big"), robots=False)
    assert response.status == 200
    assert response.body == BIG
    assert proxy.requests == [tunnel(sites, "open.test")]


async def test_https_requests_rotate_over_the_proxies(sites: HttpsSites, ca_file: str) -> None:
    async with (
        ForwardProxy(sites.addresses, egress=EGRESS[0]) as first,
        ForwardProxy(sites.addresses, egress=EGRESS[1]) as second,
        fetcher(sites, [first, second], ca_file=ca_file) as client,
    ):
        for number in range(4):
            response = await client.fetch(sites.url("open.test", f"/page/{number}"))
            assert response.status == 200
    for proxy in (first, second):
        assert proxy.requests and set(proxy.requests) == {tunnel(sites, "open.test")}
    # robots.txt, then the 4 pages: one hop each, taking turns
    assert Counter(request.peer for request in sites.requests) == {EGRESS[0]: 3, EGRESS[1]: 2}
    assert [r.path for r in sites.requests] == ["/robots.txt"] + [f"/page/{n}" for n in range(4)]


@pytest.mark.parametrize("trouble", ["an unknown CA", "a name not on the certificate"])
async def test_a_certificate_refused_inside_the_tunnel_is_a_tls_error(
    sites: HttpsSites, ca_file: str, tmp_path: Path, trouble: str
) -> None:
    resolve = {**sites.addresses, "other.test": sites.addresses["open.test"]}
    if trouble == "an unknown CA":
        host, stranger = "open.test", tmp_path / "stranger.pem"
        trustme.CA().cert_pem.write_to_path(str(stranger))
        ca_file = str(stranger)
    else:
        host = "other.test"
    async with (
        ForwardProxy(resolve) as proxy,
        fetcher(sites, [proxy], ca_file=ca_file, resolve=resolve) as client,
    ):
        with pytest.raises(FetchError) as caught:
            await client.fetch(sites.url("open.test", host=host))
    assert caught.value.reason is Reason.TLS, caught.value
    assert "certificate" in caught.value.detail
    assert proxy.requests and set(proxy.requests) == {f"CONNECT {host}:{sites.ports['open.test']}"}
    assert sites.requests == []  # the site answered the handshake, never a request


async def test_the_ssrf_guard_refuses_a_target_before_it_reaches_the_proxy(
    sites: HttpsSites, ca_file: str
) -> None:
    only_open = (f"{sites.addresses['open.test']}/32",)
    async with (
        ForwardProxy(sites.addresses) as proxy,
        fetcher(sites, [proxy], ca_file=ca_file, allow_networks=only_open) as client,
    ):
        for url in (
            sites.url("inner.test"),
            sites.url("inner.test", host=sites.addresses["inner.test"]),
        ):
            with pytest.raises(FetchError) as caught:
                await client.fetch(url)
            assert caught.value.reason is Reason.BLOCKED, caught.value
            assert "loopback" in caught.value.detail
        allowed = await client.fetch(sites.url("open.test"))
    assert allowed.status == 200
    assert set(proxy.requests) == {tunnel(sites, "open.test")}
    assert {request.host for request in sites.requests} == {"open.test"}


async def test_the_proxy_refuses_a_tunnel_to_a_network_it_does_not_allow(
    sites: HttpsSites, ca_file: str
) -> None:
    only_open = (f"{sites.addresses['open.test']}/32",)
    async with (
        ForwardProxy(sites.addresses, allow=only_open) as proxy,
        fetcher(sites, [proxy], ca_file=ca_file) as client,
    ):
        with pytest.raises(FetchError) as caught:
            await client.fetch(sites.url("inner.test"), robots=False)
        allowed = await client.fetch(sites.url("open.test"), robots=False)
    assert caught.value.reason is Reason.NETWORK
    assert "the proxy refused: 403" in caught.value.detail
    assert proxy.refused == ["inner.test"]
    assert proxy.requests == [tunnel(sites, "open.test")]
    assert allowed.status == 200
    assert sites.requests == [Request("open.test", "/page/0", "127.0.0.1")]


async def test_the_proxy_never_looks_up_a_name_it_was_not_given(
    sites: HttpsSites, ca_file: str
) -> None:
    """Neither a tunnel nor a forwarded request to a name missing from the proxy's resolve
    map leaves the machine: the proxy answers 403 without asking DNS."""
    async with (
        ForwardProxy({}) as proxy,
        fetcher(sites, [proxy], ca_file=ca_file) as client,
    ):
        with pytest.raises(FetchError) as caught:
            await client.fetch(sites.url("open.test"), robots=False)
        plain = await client.fetch(f"http://open.test:{sites.ports['open.test']}/", robots=False)
    assert caught.value.reason is Reason.NETWORK
    assert "the proxy refused: 403" in caught.value.detail
    assert plain.status == 403
    assert proxy.refused == ["open.test", "open.test"]
    assert proxy.requests == []
    assert sites.requests == []


async def test_a_site_that_does_not_answer_the_proxy_is_a_bad_gateway(
    sites: HttpsSites, ca_file: str
) -> None:
    with socket.socket() as unused:  # a port nobody listens on
        unused.bind((f"{ADDRESS_PREFIX}60", 0))
        port = unused.getsockname()[1]
    async with (
        ForwardProxy({"gone.test": f"{ADDRESS_PREFIX}60"}) as proxy,
        fetcher(
            sites, [proxy], ca_file=ca_file, resolve={"gone.test": f"{ADDRESS_PREFIX}60"}
        ) as client,
    ):
        with pytest.raises(FetchError) as caught:
            await client.fetch(f"https://gone.test:{port}/", robots=False)
    assert caught.value.reason is Reason.NETWORK
    assert "the proxy refused: 502" in caught.value.detail
    assert proxy.requests == [f"CONNECT gone.test:{port}"]


async def test_a_tunnel_closes_when_either_side_closes() -> None:
    """The client hanging up closes the proxy's connection to the site, and the site
    hanging up closes the client's; bytes sent before either make it through."""
    address = f"{ADDRESS_PREFIX}50"
    site_saw_the_end = asyncio.Event()

    async def site(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if await reader.readline() == b"bye\n":
            writer.write(b"bye yourself\n")
        else:
            await reader.read()  # until the proxy closes its side
            site_saw_the_end.set()
        writer.close()

    server = await asyncio.start_server(site, address, 0)
    port = server.sockets[0].getsockname()[1]
    async with server, ForwardProxy({"echo.test": address}) as proxy:
        for line in (b"hello\n", b"bye\n"):
            reader, writer = await asyncio.open_connection(proxy.host, proxy.port)
            writer.write(f"CONNECT echo.test:{port} HTTP/1.1\r\n\r\n".encode() + line)
            answer = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), GUARD)
            assert answer == b"HTTP/1.1 200 Connection established\r\n\r\n"
            if line == b"hello\n":
                writer.close()
                await asyncio.wait_for(site_saw_the_end.wait(), GUARD)
            else:
                assert await asyncio.wait_for(reader.read(), GUARD) == b"bye yourself\n"
                writer.close()
    assert proxy.requests == [f"CONNECT echo.test:{port}"] * 2


async def test_the_proxy_closes_open_tunnels_when_it_stops(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A tunnel still open when the proxy stops is cut on both sides, and its handler ends
    on its own (a cancelled one would make asyncio log an error)."""
    address = f"{ADDRESS_PREFIX}51"
    site_saw_the_end = asyncio.Event()

    async def site(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.read()
        site_saw_the_end.set()
        writer.close()

    server = await asyncio.start_server(site, address, 0)
    port = server.sockets[0].getsockname()[1]
    async with server:
        async with ForwardProxy({"idle.test": address}) as proxy:
            reader, writer = await asyncio.open_connection(proxy.host, proxy.port)
            writer.write(f"CONNECT idle.test:{port} HTTP/1.1\r\n\r\n".encode())
            await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), GUARD)
        assert await asyncio.wait_for(reader.read(), GUARD) == b""
        await asyncio.wait_for(site_saw_the_end.wait(), GUARD)
        writer.close()
    assert [r.getMessage() for r in caplog.records if r.levelname == "ERROR"] == []


async def test_the_crawl_command_crawls_https_seeds_through_the_proxy(
    sites: HttpsSites, ca_file: str, tmp_path: Path
) -> None:
    address = sites.addresses["open.test"]
    async with ForwardProxy(sites.addresses, egress=EGRESS[0]) as proxy:
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "crawlq",
            "crawl",
            sites.url("open.test"),
            "--proxy",
            proxy.url,
            "--out",
            str(tmp_path / "out"),
            "--resolve",
            f"open.test={address}",
            "--resolve-only",
            "--allow-network",
            "127.0.0.0/8",
            "--no-progress",
            "--ca-file",
            ca_file,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        _, stderr = await asyncio.wait_for(process.communicate(), GUARD)
    assert process.returncode == 0, stderr.decode()
    records = read_records(tmp_path / "out" / PAGES_FILE)
    pages = [sites.url("open.test", f"/page/{n}") for n in range(PAGES)]
    assert sorted(str(r["url"]) for r in records) == pages
    assert {r["status"] for r in records} == {200}
    assert proxy.requests and set(proxy.requests) == {tunnel(sites, "open.test")}
    assert {request.peer for request in sites.requests} == {EGRESS[0]}
    assert sorted(r.path for r in sites.requests if r.path != "/robots.txt") == sorted(
        f"/page/{n}" for n in range(PAGES)
    )
