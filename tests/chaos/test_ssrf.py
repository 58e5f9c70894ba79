"""The SSRF guard against servers that really listen on loopback: without the allow option a
request to a loopback, private, link-local or metadata address (in any spelling, reached
directly, by a redirect, by a name, through a proxy or by a login) is refused before a byte
is sent, recorded as `blocked_address`, and never retried; the allow option lets it through."""

from __future__ import annotations

import socket
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from aiohttp.abc import AbstractResolver, ResolveResult

from crawlq.crawl.crawler import PAGES_FILE, Crawl
from crawlq.crawl.errors import FetchError, Reason
from crawlq.crawl.fetcher import Fetcher, Login, Session
from crawlq.crawl.guard import AddressGuard, BlockedAddress, GuardedResolver
from crawlq.crawl.records import read_records
from crawlq.crawl.scope import Scope
from crawlq.crawl.testing import ForwardProxy, Site, SyntheticWeb, redirect
from crawlq.crawl.testing.sites import page_html, respond

from ..crawl.conftest import crawl_settings, fetch_settings


@pytest.fixture
async def net() -> AsyncIterator[SyntheticWeb]:
    """open.test (127.0.1.1) is the site a test allows; inner.test (127.0.1.2) the one it
    must never reach."""
    async with SyntheticWeb([Site(name="open.test", pages=3), Site(name="inner.test")]) as web_:
        yield web_


def only_open(net: SyntheticWeb, **options: object) -> Fetcher:
    """A fetcher allowed to reach open.test's address only."""
    allow = (f"{net.addresses['open.test']}/32",)
    return Fetcher(fetch_settings(net, allow_networks=allow, **options))


def inner_url(net: SyntheticWeb, host: str, path: str = "/page/0") -> str:
    return f"http://{host}:{net.ports['inner.test']}{path}"


async def refused(fetcher: Fetcher, url: str) -> FetchError:
    with pytest.raises(FetchError) as caught:
        await fetcher.fetch(url)
    assert caught.value.reason is Reason.BLOCKED, caught.value
    assert not caught.value.transient
    return caught.value


def spellings(address: str) -> list[str]:
    """Every way a URL can name this IPv4 address: dotted, decimal, hex, octal, short, and
    IPv4-mapped IPv6."""
    a, b, c, d = (int(part) for part in address.split("."))
    number = int.from_bytes(socket.inet_aton(address), "big")
    return [
        address,
        str(number),
        hex(number),
        f"{a:#x}.{b}.{c}.{d}",
        f"0{a:o}.{b}.{c}.{d}",
        f"{a}.{b}.{(c << 8) + d}",
        f"[::ffff:{address}]",
        f"[::ffff:{(a << 8) + b:x}:{(c << 8) + d:x}]",
    ]


async def test_every_spelling_of_a_loopback_address_is_refused_and_never_reaches_it(
    net: SyntheticWeb,
) -> None:
    address = net.addresses["inner.test"]
    async with Fetcher(fetch_settings(net, allow_networks=())) as fetcher:
        for host in spellings(address):
            error = await refused(fetcher, inner_url(net, host))
            assert "loopback address" in error.detail
            assert "--allow-network" in error.detail
    assert net.hits == []
    async with Fetcher(fetch_settings(net, allow_networks=(f"{address}/32",))) as fetcher:
        reached = await fetcher.fetch(net.url("inner.test"))
    assert reached.status == 200  # the refused server listens, and counts what reaches it
    assert [h.path for h in net.hits] == ["/robots.txt", "/page/0"]


@pytest.mark.parametrize(
    ("host", "kind"),
    [
        ("10.0.0.5", "private"),
        ("172.16.9.9", "private"),
        ("192.168.1.1", "private"),
        ("[fd12::1]", "private"),
        ("169.254.169.254", "cloud metadata"),
        ("169.254.3.4", "link-local"),
        ("[fe80::1]", "link-local"),
        ("0.0.0.0", "unspecified"),
        ("[::]", "unspecified"),
        ("100.64.0.1", "shared"),
        ("224.0.0.1", "multicast"),
        ("[::ffff:10.1.2.3]", "private"),
        ("[::ffff:169.254.169.254]", "cloud metadata"),
        ("[64:ff9b::a00:1]", "private"),
        ("240.0.0.1", "reserved"),
    ],
)
async def test_non_public_literal_addresses_are_refused_with_their_kind(
    net: SyntheticWeb, host: str, kind: str
) -> None:
    async with Fetcher(fetch_settings(net, allow_networks=())) as fetcher:
        error = await refused(fetcher, f"http://{host}/latest/meta-data/")
    assert f"{kind} address" in error.detail


async def test_a_name_resolving_to_a_refused_address_is_refused_at_connect_time(
    net: SyntheticWeb,
) -> None:
    resolve = {
        **net.resolve,
        "alias.test": net.addresses["inner.test"],
        "metadata.test": "169.254.169.254",
    }
    async with only_open(net, resolve=resolve) as fetcher:
        alias = await refused(fetcher, inner_url(net, "alias.test"))
        metadata = await refused(fetcher, "http://metadata.test/latest/meta-data/")
        direct = await refused(fetcher, net.url("inner.test"))
        allowed = await fetcher.fetch(net.url("open.test"))
    assert f"alias.test resolves to {net.addresses['inner.test']}" in alias.detail
    assert "metadata.test resolves to 169.254.169.254, the cloud metadata" in metadata.detail
    assert "loopback" in direct.detail
    assert allowed.status == 200
    assert net.hits_for("inner.test") == []
    assert [h.path for h in net.hits_for("open.test")] == ["/robots.txt", "/page/0"]


async def test_a_redirect_to_a_refused_address_stops_at_that_hop(net: SyntheticWeb) -> None:
    site = net.sites["open.test"]
    resolve = {**net.resolve, "alias.test": net.addresses["inner.test"]}
    site.routes["/to-literal"] = redirect(net.url("inner.test").replace("inner.test", "0x7f.1"))
    site.routes["/to-name"] = redirect(inner_url(net, "alias.test"))
    site.routes["/to-metadata"] = redirect("http://169.254.169.254/latest/meta-data/", 301)
    async with only_open(net, resolve=resolve) as fetcher:
        for path in ("/to-literal", "/to-name", "/to-metadata"):
            error = await refused(fetcher, net.url("open.test", path))
            assert [(r.url, r.status) for r in error.responses] == [
                (net.url("open.test", path), 301 if path == "/to-metadata" else 302)
            ]
    assert net.hits_for("inner.test") == []


async def test_the_allow_option_lets_allowed_networks_through(net: SyntheticWeb) -> None:
    resolve = {**net.resolve, "alias.test": net.addresses["inner.test"]}
    site = net.sites["open.test"]
    site.routes["/to-inner"] = redirect(inner_url(net, "alias.test"))
    async with Fetcher(
        fetch_settings(net, resolve=resolve, allow_networks=("127.0.1.0/24",))
    ) as fetcher:
        literal = await fetcher.fetch(inner_url(net, net.addresses["inner.test"], "/page/0"))
        named = await fetcher.fetch(inner_url(net, "alias.test"))
        redirected = await fetcher.fetch(net.url("open.test", "/to-inner"))
    assert len(redirected.history) == 1
    for response, host in [(literal, net.addresses["inner.test"]), (named, "alias.test")]:
        assert response.body == f"no site {host}".encode()  # inner.test's server answered
    assert redirected.body == named.body
    assert len(net.hits_for(net.addresses["inner.test"], pages_only=True)) == 1
    assert len(net.hits_for("alias.test", pages_only=True)) == 2


async def test_through_a_proxy_the_target_is_checked_before_it_is_sent(
    net: SyntheticWeb,
) -> None:
    resolve = {**net.resolve, "alias.test": net.addresses["inner.test"]}
    async with ForwardProxy(resolve) as proxy:
        async with only_open(net, resolve=resolve, proxies=(proxy.url,)) as fetcher:
            by_name = await refused(fetcher, inner_url(net, "alias.test"))
            by_literal = await refused(fetcher, inner_url(net, net.addresses["inner.test"]))
            allowed = await fetcher.fetch(net.url("open.test"))
        async with Fetcher(fetch_settings(net, proxies=(proxy.url,))) as guard:
            with pytest.raises(FetchError) as caught:
                await guard.fetch("http://unknown.test/")
        unknown = caught.value
    assert "alias.test resolves to" in by_name.detail
    assert "loopback" in by_literal.detail
    assert allowed.status == 200
    assert unknown.reason is Reason.DNS  # not resolvable here: not handed to the proxy either
    assert proxy.requests == [net.url("open.test", "/robots.txt"), net.url("open.test")]
    assert net.hits_for("inner.test") == [] and net.hits_for("alias.test") == []


async def test_the_proxys_own_name_passes_the_guard_as_the_proxy_only(
    net: SyntheticWeb,
) -> None:
    """The operator chose the proxy, so its name is not checked when connecting to it; a
    page that names it as a target (a service on the proxy's own host) is refused."""
    resolve = {**net.resolve, "proxy.test": "127.0.0.1"}
    async with ForwardProxy(resolve) as proxy:
        through = (f"http://proxy.test:{proxy.port}",)
        async with only_open(net, resolve=resolve, proxies=through) as fetcher:
            allowed = await fetcher.fetch(net.url("open.test"))
            target = await refused(fetcher, f"http://proxy.test:{net.ports['inner.test']}/")
    assert allowed.status == 200
    assert "proxy.test resolves to 127.0.0.1, a loopback address" in target.detail
    assert proxy.requests == [net.url("open.test", "/robots.txt"), net.url("open.test")]


async def test_a_login_at_a_refused_address_fails_as_blocked_not_as_a_retryable_login(
    net: SyntheticWeb,
) -> None:
    async def sign_in(session: Session) -> None:
        await session.post(net.url("inner.test", "/login"), data={"password": "secret"})

    async with only_open(net) as fetcher:
        fetcher.add_login("open.test", Login(perform=sign_in))
        error = await refused(fetcher, net.url("open.test"))
    assert net.hits_for("inner.test") == []
    assert "loopback" in error.detail


async def test_a_crawl_records_every_refusal_once_and_never_retries_it(
    net: SyntheticWeb, tmp_path: Path
) -> None:
    """Seeds, discovered links and redirect targets to refused addresses: one record each,
    `blocked_address`, no retry, no request (robots.txt included) to the refused server. (A
    redirect to another host is queued as a page of that host: the page that redirected is
    a 302 with one link.)"""
    inner = net.addresses["inner.test"]
    links = [
        net.url("inner.test", "/page/0"),  # a name that resolves to a refused address
        inner_url(net, inner, "/page/1"),  # the address itself
        inner_url(net, str(int.from_bytes(socket.inet_aton(inner), "big")), "/page/2"),
        "http://169.254.169.254/latest/meta-data/",
        net.url("open.test", "/page/1"),
    ]
    site = net.sites["open.test"]
    site.routes["/page/0"] = respond(200, page_html("links", links))
    site.routes["/hop"] = redirect("http://10.0.0.5/admin")
    settings = crawl_settings(
        net,
        tmp_path,
        fetch=fetch_settings(net, allow_networks=(f"{net.addresses['open.test']}/32",)),
        scope=Scope(),
    )
    crawl = Crawl(settings)
    stats = await crawl.run([net.url("open.test"), net.url("open.test", "/hop")], concurrency=8)
    records = {str(r["url"]): r for r in read_records(tmp_path / PAGES_FILE)}
    assert len(records) == len(read_records(tmp_path / PAGES_FILE))  # one record per URL
    blocked = {url for url, r in records.items() if r["error"] == Reason.BLOCKED.value}
    assert blocked == {*links[:4], "http://10.0.0.5/admin"}
    assert all(records[url]["retry"] is False for url in blocked)
    assert all("--allow-network" in str(records[url]["detail"]) for url in blocked)
    hop = records[net.url("open.test", "/hop")]
    assert (hop["status"], hop["error"], hop["links"], hop["queued"]) == (302, None, 1, 1)
    assert records[net.url("open.test", "/page/1")]["status"] == 200
    assert stats.failed == 0 and stats.done == len(records)
    assert net.hits_for("inner.test") == []
    assert not [h for h in net.hits if h.peer.startswith(inner)]
    assert len([h for h in net.hits if h.host != "open.test"]) == 0


async def test_the_allowed_site_is_reachable_by_its_literal_address(
    net: SyntheticWeb,
) -> None:
    """With the allow option, the literal addresses aiohttp accepts reach the server."""
    address = net.addresses["open.test"]
    async with only_open(net) as fetcher:
        response = await fetcher.fetch(f"http://{address}:{net.ports['open.test']}/page/1")
    assert response.body == f"no site {address}".encode()  # answered by open.test's server
    assert [h.path for h in net.hits if h.host == address] == ["/robots.txt", "/page/1"]


class Rebinding(AbstractResolver):
    """Answers each name with the next list of `answers`: a DNS record that changes."""

    def __init__(self, *answers: list[str]) -> None:
        self.answers = list(answers)

    async def resolve(
        self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET
    ) -> list[ResolveResult]:
        addresses = self.answers.pop(0)
        return [
            ResolveResult(hostname=host, host=a, port=port, family=family, proto=0, flags=0)
            for a in addresses
        ]

    async def close(self) -> None:
        pass


async def test_every_resolution_is_checked_so_a_rebound_name_is_refused() -> None:
    """The guard checks each answer the connector gets (nothing is connected to here): a
    name that was public and rebinds to loopback is refused; of mixed answers only the
    public ones are kept; a proxy's own name is never refused."""
    inner = Rebinding(["8.8.8.8"], ["127.0.0.1"], ["8.8.4.4", "10.0.0.7"], ["127.0.0.1"])
    resolver = GuardedResolver(inner, AddressGuard(), exempt=["proxy.internal"])
    first = await resolver.resolve("rebind.test", 80)
    with pytest.raises(BlockedAddress) as caught:
        await resolver.resolve("rebind.test", 80)
    mixed = await resolver.resolve("rebind.test", 80)
    proxy = await resolver.resolve("proxy.internal", 3128)
    assert [r["host"] for r in first] == ["8.8.8.8"]
    assert "rebind.test resolves to 127.0.0.1, a loopback address" in str(caught.value)
    assert [r["host"] for r in mixed] == ["8.8.4.4"]
    assert [r["host"] for r in proxy] == ["127.0.0.1"]
