"""Login sessions reached through redirects (fetcher.py `_expired_session`): the session
that came back logged out is the one that signs in again."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from crawlq.crawl.fetcher import Fetcher, Login, Session
from crawlq.crawl.testing import Site, SyntheticWeb, redirect

from .conftest import fetch_settings
from .test_fetcher import members_site


@pytest.fixture
async def net() -> AsyncIterator[SyntheticWeb]:
    async with SyntheticWeb([Site(name="a.test", pages=5), Site(name="b.test", pages=5)]) as web_:
        yield web_


async def test_of_two_login_domains_on_a_chain_the_one_logged_out_logs_in_again(
    net: SyntheticWeb,
) -> None:
    """a.test/go (a login domain whose session stays good) -> b.test/members/1, where
    b.test's session lasts one page: the second fetch ends at b.test's login page, and it is
    b.test's session that must sign in again, not a.test's, the first on the chain."""
    logins = members_site(net, uses_per_login=1)
    net.sites["a.test"].routes["/go"] = redirect(net.url("b.test", "/members/1"))
    signed_in: list[str] = []

    async def sign_in_a(session: Session) -> None:
        signed_in.append("a.test")

    async def sign_in_b(session: Session) -> None:
        signed_in.append("b.test")
        await session.post(net.url("b.test", "/login"), data={"user": "ann", "password": "secret"})

    async with Fetcher(fetch_settings(net)) as fetcher:
        fetcher.add_login("a.test", Login(perform=sign_in_a))
        fetcher.add_login("b.test", Login(perform=sign_in_b))
        answers = [await fetcher.fetch(net.url("a.test", "/go")) for _ in range(2)]
    assert [r.text() for r in answers] == ["<title>secret /members/1</title>"] * 2
    assert logins == ["token-0", "token-1"]
    assert signed_in == ["a.test", "b.test", "b.test"]
