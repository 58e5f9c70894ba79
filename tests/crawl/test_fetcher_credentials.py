"""`Fetcher.fetch(credentials=...)`: the hops it refuses, and every hop after the first it
refuses, go without the crawl's credentials: no cookie from the jar (nor kept from their
answers), no login, no credential header, whether the caller's or a login hook's."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from crawlq.crawl.fetcher import Fetcher, Login, Session
from crawlq.crawl.testing import Site, SyntheticWeb, redirect, respond

from .conftest import fetch_settings

SET_SESSION = {"Set-Cookie": "sid=secret; Path=/; HttpOnly; SameSite=Strict"}


@pytest.fixture
async def net() -> AsyncIterator[SyntheticWeb]:
    routes = {"/login": respond(headers=SET_SESSION), "/data": respond(body="data")}
    sites = [Site(name="a.test"), Site(name="b.test", routes=routes)]
    async with SyntheticWeb(sites) as web_:
        yield web_


def none(_: str) -> bool:
    return False


async def test_a_fetch_without_credentials_sends_no_cookie_login_or_credential_header(
    net: SyntheticWeb,
) -> None:
    """b.test has a login hook that sets a cookie and a token header on its session. A
    fetch without credentials neither signs in nor sends them, nor the caller's
    Authorization; the cookie its answer sets is not kept. The same fetch with credentials
    signs in and sends both, as before."""
    signed_in: list[str] = []

    async def sign_in(session: Session) -> None:
        signed_in.append("b.test")
        await session.post(net.url("b.test", "/login"))
        session.client.headers["X-Api-Key"] = "key"

    url = net.url("b.test", "/data")
    caller = {"Authorization": "Bearer page", "X-Kept": "1"}
    net.sites["b.test"].routes["/anonymous"] = respond(headers={"Set-Cookie": "other=1"})
    async with Fetcher(fetch_settings(net, robots=False)) as fetcher:
        fetcher.add_login("b.test", Login(perform=sign_in))
        await fetcher.fetch(url, headers=caller, credentials=none)
        await fetcher.fetch(net.url("b.test", "/anonymous"), credentials=none)
        assert signed_in == []
        await fetcher.fetch(url, headers=caller)
    assert signed_in == ["b.test"]
    bare, signed = [h for h in net.hits if h.path == "/data"]
    assert bare.cookies == {} and "X-Api-Key" not in bare.headers
    assert "Authorization" not in bare.headers and bare.headers["X-Kept"] == "1"
    assert signed.cookies == {"sid": "secret"}  # not "other": that answer was not kept
    assert signed.headers["X-Api-Key"] == "key"
    assert signed.headers["Authorization"] == "Bearer page"


async def test_credentials_stop_at_the_first_hop_refused_and_do_not_come_back(
    net: SyntheticWeb,
) -> None:
    """a.test/go -> b.test/back -> a.test/data, both sites' cookies in the jar; credentials
    allowed on a.test only: the first hop sends a.test's cookie, b.test's gets none, and
    neither does the way back to a.test."""
    net.sites["a.test"].routes["/"] = respond(headers={"Set-Cookie": "a=1; Path=/"})
    net.sites["a.test"].routes["/go"] = redirect(net.url("b.test", "/back"))
    net.sites["b.test"].routes["/"] = respond(headers={"Set-Cookie": "b=1; Path=/"})
    net.sites["b.test"].routes["/back"] = redirect(net.url("a.test", "/data"))
    net.sites["a.test"].routes["/data"] = respond(body="data")

    def a_only(hop: str) -> bool:
        return hop.startswith(net.url("a.test", "/"))

    async with Fetcher(fetch_settings(net, robots=False)) as fetcher:
        for name in ("a.test", "b.test"):
            await fetcher.fetch(net.url(name, "/"))
        response = await fetcher.fetch(net.url("a.test", "/go"), credentials=a_only)
    assert response.body == b"data"
    cookies = {h.path: h.cookies for h in net.hits if h.path in ("/go", "/back", "/data")}
    assert cookies == {"/go": {"a": "1"}, "/back": {}, "/data": {}}
