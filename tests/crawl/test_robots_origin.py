"""`robots.origin` reads plain URLs with a pattern and the rest with urlsplit: both ways must
name the same host for every URL, or a host's rules would be looked up under two names."""

from __future__ import annotations

from urllib.parse import urlsplit

import pytest
from hypothesis import given
from hypothesis import strategies as st

from crawlq.crawl.robots import origin


def _by_urlsplit(url: str) -> str:
    parts = urlsplit(url)
    return f"{parts.scheme.lower()}://{parts.netloc.rpartition('@')[2].lower()}"


CASES = [
    "http://a.test/x",
    "https://A.test:8443/",
    "HTTP://a.test/",
    " http://a.test/",
    "http://user:pw@a.test/",
    "http://a.test",
    "http://a.test?x=1",
    "http://a.test#top",
    "http://a.test:8/p?q#f",
    "http://[::1]:8080/p",
    "http://[::1/p",
    "http://a.test\t/x",
    "http://a.te\nst/x",
    "http://a.test\\x/",
    "http://a_b.test/",
    "http://a.test%41/",
    "http://xn--bcher-kva.test/",
    "http://a.test:/",
    "ftp://a.test/",
]


def _agree(url: str) -> None:
    try:
        expected = _by_urlsplit(url)
    except ValueError:  # urlsplit refuses it (an invalid IPv6 literal): so must origin
        with pytest.raises(ValueError):
            origin(url)
        return
    assert origin(url) == expected, url


def test_known_urls() -> None:
    for url in CASES:
        _agree(url)


URL_CHARACTERS = st.sampled_from([*"aZ09.-_:@[]/?#%\\ \t\n", "ä", "\x00"])


@given(
    st.sampled_from(["http://", "https://", "HTTPS://", "http:/", " http://", "mailto:"]),
    st.text(URL_CHARACTERS, max_size=30),
)
def test_any_url(prefix: str, rest: str) -> None:
    _agree(prefix + rest)
