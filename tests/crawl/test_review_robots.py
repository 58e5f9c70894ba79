"""Which robots.txt rules are costly (robots.py `Rules.costly`): every wildcard rule protego
reads counts, however its lines are written."""

from __future__ import annotations

import time

import pytest
from protego import Protego

from crawlq.crawl.response import Response
from crawlq.crawl.robots import MAX_CHEAP_PATTERNS, MAX_CHEAP_RULES, RobotsCache

AGENT = "crawlq"
URL = "http://a.test/page/1"


def answer(text: str) -> Response:
    body = text.encode()
    return Response(
        url="http://a.test/robots.txt",
        status=200,
        reason="OK",
        http_version="1.1",
        headers=(("Content-Type", "text/plain"),),
        raw=body,
        body=body,
        fetched_at=time.time(),
        elapsed=0.0,
    )


def cache_of(text: str) -> RobotsCache:
    """A cache whose every robots.txt answers `text`."""

    async def fetch(url: str) -> Response:
        return answer(text)

    return RobotsCache(fetch, AGENT, ttl=60.0)


def rules_text(line: str, separator: str, *, head: str = "User-agent: *") -> str:
    rules = [line.format(n=n) for n in range(MAX_CHEAP_PATTERNS + 1)]
    return separator.join([head, "Disallow: /page/1", *rules, ""])


@pytest.mark.parametrize(
    ("line", "separator"),
    [
        ("Disallow: /*x*y{n}", "\n"),  # as the count expected them
        ("Disallow: /*x*y{n}", "\r"),  # old Mac line ends: one line to a MULTILINE ^
        ("Disallow: /*x*y{n}", "\x0c"),  # a form feed ends a line for str.splitlines
        ("Disallow: /*x*y{n}", "\u2028"),
        ("Disallow /*x*y{n}", "\n"),  # no colon: protego reads "field value" too
        ("Dissallow: /*x*y{n}", "\n"),  # misspellings protego accepts
        ("disalow: /*x*y{n}", "\n"),
        ("Diasllow: /*x*y{n}", "\n"),
        ("\xa0Disallow: /*x*y{n}", "\n"),  # leading white space str.strip removes
        ("Allow: /*x*y{n}$", "\r\n"),
    ],
)
async def test_wildcard_rules_count_however_their_lines_are_written(
    line: str, separator: str
) -> None:
    text = rules_text(line, separator)
    parser = Protego.parse(text)
    assert not parser.can_fetch(URL, AGENT)  # protego reads the file's rules
    assert parser.can_fetch("http://a.test/page/2", AGENT)

    cache = cache_of(text)
    rules = await cache.rules(URL)
    assert rules.costly
    assert not cache.disallows(URL)  # not matched one link at a time on the loop


async def test_a_user_agent_line_with_a_wildcard_is_no_rule() -> None:
    text = "\n".join(["User-agent: *"] * (MAX_CHEAP_PATTERNS + 5) + ["Disallow: /page/1", ""])

    cache = cache_of(text)
    assert not (await cache.rules(URL)).costly
    assert cache.disallows(URL)


async def test_many_plain_rules_are_costly_too() -> None:
    """`Allow: /` matches every URL as a plain prefix, so protego matches each URL against
    every rule in turn: 26,000 plain rules took about 6 ms a URL, more than 1,000 wildcard
    rules do. Over MAX_CHEAP_RULES rules of any kind are costly."""
    plain = [f"Disallow: /a{n}/b" for n in range(MAX_CHEAP_RULES + 1)]
    text = "\n".join(["User-agent: *", "Allow: /", "Disallow: /page/1", *plain, ""])
    parser = Protego.parse(text)
    assert not parser.can_fetch(URL, AGENT)

    cache = cache_of(text)
    assert (await cache.rules(URL)).costly
    assert not cache.disallows(URL)


async def test_a_few_thousand_plain_rules_and_sitemaps_are_cheap() -> None:
    plain = [f"Disallow: /a{n}/b" for n in range(MAX_CHEAP_RULES // 2)]
    sitemaps = [f"Sitemap: http://a.test/s{n}.xml" for n in range(MAX_CHEAP_RULES)]
    text = "\n".join(["User-agent: *", "Disallow: /page/1", *plain, *sitemaps, ""])

    cache = cache_of(text)
    assert not (await cache.rules(URL)).costly
    assert cache.disallows(URL)
