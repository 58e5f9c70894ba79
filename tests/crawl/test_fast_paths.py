"""The crawler's fast paths give the same answers as the general ones."""

from __future__ import annotations

import random
from urllib.parse import urljoin

import pytest

from crawlq.crawl.scope import Scope
from crawlq.crawl.urls import absolute, canonicalize, is_canonical, origin_of, unquote_spaces

BASE = "http://site7.test:8080/a/b/page5.html"
HREFS = [
    "/page/6", "/a/./b", "/a//b", "/a/b/", "/", "/x.html", "/.hidden", "/a/..", "/%41",
    "/a?b", "/a#b", "/ü", "/a b", "/-a/_b~", "/a/b.", "/a/.b/", "//other.test/x", "rel/x",
]  # fmt: skip


@pytest.mark.parametrize("href", HREFS)
def test_a_plain_path_joined_to_the_origin_is_what_the_general_path_gives(href: str) -> None:
    base = canonicalize(BASE)
    assert base is not None
    assert absolute(base, href, base_origin=origin_of(base)) == absolute(base, href)


def _parsed(base: str, href: str) -> str | None:
    """What `absolute` gives by parsing every link (the general path)."""
    href = href.strip()
    if not href or href.startswith("#"):
        return None
    try:
        return canonicalize(urljoin(base, unquote_spaces(href)))
    except ValueError:
        return None


BASES = [
    "http://site7.test:8080/a/b/page5.html", "https://e.test/", "https://e.test/a/b/",
    "http://e.test/a/b?q=1", "http://e.test/a//b/c.html", "http://e.test/.hidden/x",
    "http://e.test/a%20b/c", "https://e.test/x.html?a=b/c", "http://e.test/a/b/.x/",
]  # fmt: skip
PIECES = [
    "a", "b", "x.html", ".", "..", "/", "//", "?", "#", "%41", "%2f", "=", "&", ":", "@",
    "-", "_", "~", " ", "A", "ü", "http:", "https://e.test", "http://E.test", "//o.test",
    ":8080", ":80", ":443", ";", "'", "+", "\\", "?a=b", "#f", "...", ".b",
]  # fmt: skip


def test_every_link_resolves_as_parsing_it_would() -> None:
    rng = random.Random(7)
    for _ in range(20_000):
        base = canonicalize(rng.choice(BASES))
        assert base is not None
        href = "".join(rng.choice(PIECES) for _ in range(rng.randrange(1, 7)))
        parsed = _parsed(base, href)
        assert absolute(base, href, base_origin=origin_of(base)) == parsed, (base, href)
        assert absolute(base, href) == parsed, (base, href)


def test_allowed_domains_match_hosts_and_their_sub_domains_only() -> None:
    scope = Scope(domains=("Example.org", "site1.test"))
    assert scope.refusal("http://example.org/") is None
    assert scope.refusal("https://a.b.EXAMPLE.org:8443/x") is None
    assert scope.refusal("http://site1.test:81/page/0") is None
    assert scope.refusal("http://badexample.org/") is not None
    assert scope.refusal("http://site11.test/") is not None
    assert scope.refusal("http://user@example.org/") is None
    assert scope.refusal("http://[::1]/") is not None


@pytest.mark.parametrize(
    ("url", "canonical"),
    [
        ("http://e.test/a//b.html", "http://e.test/a//b.html"),
        ("http://e.test/a//b", "http://e.test/a//b"),
        ("http://e.test/a/./b/../c.html", "http://e.test/a/c.html"),
        ("http://e.test/a/b/..", "http://e.test/a/"),
        ("http://e.test/a/b/.", "http://e.test/a/b/"),
        ("http://e.test/../../a", "http://e.test/a"),
        ("http://e.test/..", "http://e.test/"),
        ("http://e.test/a//../b", "http://e.test/a/b"),
        ("http://e.test/.hidden/x.y", "http://e.test/.hidden/x.y"),
    ],
)
def test_dot_segments_go_and_empty_segments_stay(url: str, canonical: str) -> None:
    """posixpath.normpath folded /a//b.html into /a/b.html (only when the path had a dot),
    another resource to the server."""
    assert canonicalize(url) == canonical


LONG = 20_000


@pytest.mark.parametrize(
    "href",
    [
        "a" * LONG + "!",
        "/" + "a" * LONG + "!",
        "/" + "a/" * LONG + "%",
        "a/" * LONG + "!",
        "http://" + "a" * LONG + "!",
        "http://" + "a-" * LONG + "-/x!",
        "http://a.test/" + "a/" * LONG + "!",
    ],
    ids=lambda href: href[:12] + "..." + href[-3:],
)
def test_a_long_link_that_is_almost_plain_resolves_as_parsing_it_would(href: str) -> None:
    """A page writes what it likes: a pattern with nested repetitions took exponential time
    to fail on 30 such characters and a stray one (this test would not end)."""
    base = "http://e.test/a/b.html"
    assert absolute(base, href, base_origin=origin_of(base)) == _parsed(base, href)
    assert is_canonical(href) == (canonicalize(href) == href)


@pytest.mark.parametrize(
    ("base", "href"),
    [
        ("http://e.test/a//b/c.html", "../../x"),  # urljoin drops the base's empty segments first
        ("http://e.test/a//", ".."),
        ("http://e.test/a///", "../..?q"),
        ("http://e.test/", "/docs\xa0#top"),  # whitespace canonicalize strips once the # is cut
        ("http://e.test/a/", "x\x0c#y"),
        ("http://e.test/a/", "x\u3000?#y"),
        ("http://e.test/", "http://e.test:80/x"),
        ("http://e.test/", "https://e.test:443/"),
        ("http://e.test/", "http://e.test:080/"),
        ("http://e.test/", "https://e.test:080/"),
        ("http://e.test/", "http://e.test:65536/"),
        ("http://e.test/", "http://e.test:99999/x?a"),
        ("http://e.test/", "/a?["),
        ("http://e.test/", "a?b[c"),
        ("http://e.test/d/", "a:b/../c"),
        ("http://e.test/d/", "a//../b"),
    ],
)
def test_links_the_random_draws_miss_resolve_as_parsing_them_would(base: str, href: str) -> None:
    assert absolute(base, href, base_origin=origin_of(base)) == _parsed(base, href)
    assert absolute(base, href) == _parsed(base, href)
