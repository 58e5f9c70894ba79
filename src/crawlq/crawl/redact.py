"""Credentials kept out of what the crawler writes: page records, WARC files and their index,
error messages (and so the logs and dead letters that quote them).

- URLs: the userinfo (`user:password@`, or a user alone, often a token) becomes `***@`
  (still a valid URL), in a URL and in any text that quotes one;
- headers in WARC records: the values of Authorization, Proxy-Authorization and Cookie, and
  of Set-Cookie (the session a login opens is as good as the password while it lasts, and a
  WARC is kept and shared long after: the cookie's name and attributes stay, its value goes),
  and of every header named as a secret (`secret_header`: X-Auth-Token, X-Subject-Token, an
  API's session header). Which names are secrets is told in observe/logs.py, the one list
  the logs and every other output mask by too.

The crawler sends no request record to the WARC files, so the requests' own headers (the
cookies and credentials it sends) are written nowhere. In memory, responses and the queue
keep the URLs as given: the fetcher needs their credentials to send them.
"""

from __future__ import annotations

import enum
import functools
import re

from ..observe.logs import SECRET_HEADERS, redact, redact_userinfo, secret_header

REDACTED = "[redacted]"
#: A cookie's value in Cookie (a=1; b=2) and Set-Cookie (a=1; Path=/: only the first).
_COOKIE_VALUE = re.compile(r"(?P<name>(?:^|;)\s*[^=;\s]+=)[^;]*")

#: `url` without its userinfo's secrets (`http://***@host/`), nothing else changed: the key
#: of the WARC index, so two URLs stay two.
redact_url = redact_userinfo
#: Every credential in `text` masked (error messages quote URLs, headers, forms).
redact_text = redact


def redact_header(name: str, value: str) -> str:
    """A header's value as a WARC record may keep it."""
    kind = _header_kind(name.lower())
    if kind is _Kind.PLAIN:
        return value
    if kind is _Kind.SET_COOKIE:
        return _COOKIE_VALUE.sub(rf"\g<name>{REDACTED}", value, count=1)
    if kind is _Kind.COOKIE:
        return _COOKIE_VALUE.sub(rf"\g<name>{REDACTED}", value)
    if kind is _Kind.CREDENTIALS:  # Authorization: keep the scheme (Basic, Bearer...)
        scheme, _, credentials = value.strip().partition(" ")
        return f"{scheme} {REDACTED}" if credentials else REDACTED
    if kind is _Kind.SECRET:
        return REDACTED
    return redact_text(value)  # _Kind.URLS


class _Kind(enum.Enum):
    PLAIN = enum.auto()
    SET_COOKIE = enum.auto()
    COOKIE = enum.auto()
    CREDENTIALS = enum.auto()
    SECRET = enum.auto()
    URLS = enum.auto()


@functools.lru_cache(maxsize=4096)
def _header_kind(lowered: str) -> _Kind:
    """What a header so named holds, remembered: a WARC record writes every header of every
    response, and the same few names come again and again."""
    if lowered in ("set-cookie", "set-cookie2"):
        return _Kind.SET_COOKIE
    if lowered == "cookie":
        return _Kind.COOKIE
    if lowered in SECRET_HEADERS:
        return _Kind.CREDENTIALS
    if secret_header(lowered):
        return _Kind.SECRET
    if lowered in ("location", "content-location", "refresh", "link"):
        return _Kind.URLS
    return _Kind.PLAIN
