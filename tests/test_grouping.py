"""A host has one group whatever its spelling: no URL escapes its limits by being written
another way."""

from __future__ import annotations

import pytest

from crawlq.errors import InvalidElement
from crawlq.grouping import url_host


@pytest.mark.parametrize(
    ("url", "host"),
    [
        ("http://bücher.example/x", "xn--bcher-kva.example"),
        ("http://xn--bcher-kva.example/", "xn--bcher-kva.example"),
        ("http://example.test./a", "example.test"),
        ("http://Example.TEST:8080/", "example.test"),
        ("http://ex%61mple.test/", "example.test"),
        ("http://user:pw@example.test/", "example.test"),
        ("http://2130706433/", "127.0.0.1"),
        ("http://0x7f.1/", "127.0.0.1"),
        ("http://127.0.0.1:80/", "127.0.0.1"),
        ("http://[::1]:8/", "::1"),
        ("https://a.b.example.co.uk/x?y", "a.b.example.co.uk"),
    ],
)
def test_every_spelling_of_a_host_gives_one_group(url: str, host: str) -> None:
    assert url_host(url) == host


@pytest.mark.parametrize(
    "url",
    ["http://1.2.3.4.5/", "http://999.1.1.1/", "http://exa%20mple.test/", "http://a%2Fb.test/"],
)
def test_a_host_that_is_no_host_is_refused(url: str) -> None:
    with pytest.raises(InvalidElement, match=r"host|IPv4"):
        url_host(url)
