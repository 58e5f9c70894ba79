"""Which headers a redirect to another origin drops (fetcher.py `credential`): every one
named as a secret, word by word, and none that only contains such letters."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from crawlq.crawl.errors import FetchError, Reason
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


@pytest.mark.parametrize("status", [307, 308])
async def test_a_body_is_never_sent_again_to_another_origin(net: SyntheticWeb, status: int) -> None:
    """A 307 or 308 sends the request's body again; a login form's password cannot be taken
    out of it as a header can: a redirect of a POST to another origin is a bad answer, and
    the body goes no further. To the same origin, it goes on."""
    net.sites["a.test"].routes["/login"] = redirect(net.url("b.test", "/collect"), status)
    net.sites["a.test"].routes["/again"] = redirect("/page/0", status)
    async with Fetcher(fetch_settings(net)) as fetcher:
        with pytest.raises(FetchError) as refused:
            await fetcher.fetch(net.url("a.test", "/login"), method="POST", data=b"password=pw")
        kept = await fetcher.fetch(net.url("a.test", "/again"), method="POST", data=b"q=1")
    assert refused.value.reason is Reason.BAD_RESPONSE
    assert [r.status for r in refused.value.responses] == [status]
    assert net.hits_for("b.test") == []
    assert (kept.status, kept.url) == (200, net.url("a.test", "/page/0"))
