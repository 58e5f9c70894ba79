"""Which headers a redirect to another origin drops (fetcher.py `credential`): every one
named as a secret, word by word, and none that only contains such letters."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from crawlq.crawl.fetcher import Fetcher, credential
from crawlq.crawl.testing import Site, SyntheticWeb, redirect
from crawlq.observe.logs import redact, secret_name

from .conftest import fetch_settings

SECRETS = {
    "X-Auth-Key": "cloudflare-global-key",  # Cloudflare's, with X-Auth-Email
    "X-Auth-Email": "ann@example.org",
    "X-Auth-User": "ann",  # OpenStack Swift's, with X-Auth-Key
    "X-Storage-Pass": "swift-password",
    "X-Authorization": "Bearer T",
    "X-Access-Key": "AK",
    "Ocp-Apim-Subscription-Key": "azure-key",
    "X-Auth": "A",
}
PLAIN = {
    "Accept-Signature": 'sig1=("@method")',  # asks for a signed answer: nothing secret
    "Keep-Alive": "timeout=5",
    "X-Passthrough": "1",
    "Sec-Fetch-Site": "none",
    "X-Trace": "t1",
}


@pytest.fixture
async def net() -> AsyncIterator[SyntheticWeb]:
    async with SyntheticWeb([Site(name="a.test", pages=1), Site(name="b.test", pages=1)]) as web_:
        yield web_


async def test_secret_headers_stay_behind_and_plain_ones_go_on(net: SyntheticWeb) -> None:
    net.sites["a.test"].routes["/go"] = redirect(net.url("b.test", "/page/0"))
    async with Fetcher(fetch_settings(net)) as fetcher:
        response = await fetcher.fetch(net.url("a.test", "/go"), headers={**SECRETS, **PLAIN})
    assert response.url == net.url("b.test", "/page/0")
    (first,) = net.hits_for("a.test", pages_only=True)
    (moved,) = net.hits_for("b.test", pages_only=True)
    assert {name: first.headers.get(name) for name in SECRETS} == SECRETS
    assert {name: moved.headers.get(name) for name in SECRETS} == dict.fromkeys(SECRETS)
    assert {name: moved.headers.get(name) for name in PLAIN} == PLAIN


@pytest.mark.parametrize(
    "name", ["X-Api-Key", "x-auth-token", "X-Session-Id", "Private-Token", "Cookie", "Api_Key"]
)
def test_the_usual_secret_headers_are_credentials(name: str) -> None:
    assert credential(name)


def test_logs_mask_what_the_fetcher_keeps_from_another_origin() -> None:
    """One judge of secret names serves both: a value the fetcher would not carry to another
    origin is masked in a log line too."""
    query = (
        "https://a.test/?x-auth-key=K&access_key=AK&private_key=PK&passphrase=P&AWSAccessKeyId=A"
    )
    assert redact(query) == (
        "https://a.test/?x-auth-key=***&access_key=***&private_key=***&passphrase=***"
        "&AWSAccessKeyId=***"
    )
    kept = "https://a.test/?author=x&keyword=k&monkey=m&bypass=b&q=tokenless"
    assert redact(kept) == kept
    assert all(secret_name(name) for name in SECRETS)
