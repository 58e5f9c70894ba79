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
    lowered = name.lower()
    if lowered in ("set-cookie", "set-cookie2"):
        return _COOKIE_VALUE.sub(rf"\g<name>{REDACTED}", value, count=1)
    if lowered == "cookie":
        return _COOKIE_VALUE.sub(rf"\g<name>{REDACTED}", value)
    if lowered in SECRET_HEADERS:  # Authorization: keep the scheme (Basic, Bearer...)
        scheme, _, credentials = value.strip().partition(" ")
        return f"{scheme} {REDACTED}" if credentials else REDACTED
    if secret_header(lowered):
        return REDACTED
    if lowered in ("location", "content-location", "refresh", "link"):
        return redact_text(value)
    return value
