"""URL canonicalization: one spelling per resource, so the queue's identity dedupes it.

Lower-case scheme and host, IDNA host, no default port, no fragment, dot segments resolved,
percent-escapes normalized (unreserved characters decoded, the rest upper-case), an empty
path made "/". The query keeps its order: servers may care about it. A URL longer than
MAX_URL_LENGTH once canonical is none a crawler follows.
"""

from __future__ import annotations

import re
from urllib.parse import quote, urljoin, urlsplit, urlunsplit

DEFAULT_PORTS = {"http": 80, "https": 443}
#: Characters of the longest URL followed: what common servers and CDNs take in a request
#: line (8 KB). A page's junk or hostile link beyond it would be an element of its own too
#: large for the queue, and fail the page that found it.
MAX_URL_LENGTH = 8192
#: Characters of input read at most: percent-escaping can make a URL three times longer.
_MAX_INPUT = 3 * MAX_URL_LENGTH
_ESCAPE = re.compile(r"%[0-9A-Fa-f]{2}")
_UNRESERVED = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-._~")
_PATH_SAFE = "/:@!$&'()*+,;=-._~%"
_QUERY_SAFE = "/?:@!$&'()*+,;=-._~%"


def _normalize_escapes(part: str, safe: str) -> str:
    def fix(match: re.Match[str]) -> str:
        char = chr(int(match.group(0)[1:], 16))
        return char if char in _UNRESERVED else match.group(0).upper()

    return quote(_ESCAPE.sub(fix, part), safe=safe)


def _remove_dot_segments(path: str) -> str:
    """RFC 3986 section 5.2.4 on an absolute path: "." and ".." segments resolved, and only
    they (an empty segment stays: /a//b is not /a/b to a server)."""
    if "/." not in path:
        return path
    segments = path.split("/")[1:]
    kept: list[str] = []
    for segment in segments:
        if segment == "..":
            if kept:
                kept.pop()
        elif segment != ".":
            kept.append(segment)
    if segments[-1] in (".", ".."):
        kept.append("")  # /a/b/.. is /a/
    return "/" + "/".join(kept)


def canonicalize(url: str) -> str | None:
    """The canonical form of an absolute http(s) URL; None if it is not one, or longer than
    MAX_URL_LENGTH."""
    if len(url) > _MAX_INPUT:
        return None
    try:
        parts = urlsplit(url.strip())
        port = parts.port
    except ValueError:
        return None
    scheme = parts.scheme.lower()
    host = parts.hostname
    if scheme not in DEFAULT_PORTS or not host:
        return None
    try:
        host = host.encode("idna").decode("ascii") if not host.isascii() else host.lower()
    except UnicodeError:
        return None
    if ":" in host:
        host = f"[{host}]"
    netloc = host if port in (None, DEFAULT_PORTS[scheme]) else f"{host}:{port}"
    if parts.username or parts.password:
        user = parts.username or ""
        netloc = f"{user}:{parts.password}@{netloc}" if parts.password else f"{user}@{netloc}"
    path = _remove_dot_segments(_normalize_escapes(parts.path, _PATH_SAFE)) or "/"
    query = _normalize_escapes(parts.query, _QUERY_SAFE)
    canonical = urlunsplit((scheme, netloc, path, query, ""))
    return canonical if len(canonical) <= MAX_URL_LENGTH else None


# Each pattern below matches in time linear in its input: every repetition is delimited by
# a character it cannot hold itself. A link is anything a page writes, and `(?:x+/?)*` takes
# exponential time to fail on a long run of x followed by a stray character.
_SEGMENT = r"[A-Za-z0-9_~-][A-Za-z0-9._~-]*"
#: A root-relative path that is already canonical: no dot segments, no empty segments, only
#: unreserved characters (no escapes, query or fragment).
_PLAIN_PATH = re.compile(rf"/(?:{_SEGMENT}(?:/{_SEGMENT})*/?)?")


_LABEL = r"[a-z0-9]+(?:-+[a-z0-9]+)*"
#: An http(s) URL `canonicalize` leaves as it is: lower-case ASCII host, a port (if any)
#: written plainly, and a plain path (no query, no fragment, no userinfo).
_PLAIN_URL = re.compile(
    rf"(https?)://{_LABEL}(?:\.{_LABEL})*(?::([1-9][0-9]{{0,4}}))?{_PLAIN_PATH.pattern}"
)


#: A query `canonicalize` leaves as it is: not empty, no escapes, no character it escapes.
_PLAIN_QUERY = r"(?:\?[A-Za-z0-9._~!$&'()*+,;=:@/?-]+)?"
#: Links resolved without parsing when they are plain: a root-relative path, a relative one
#: (dot segments and all), an absolute URL; each with a plain query, if any.
_PLAIN_ROOTED = re.compile(_PLAIN_PATH.pattern + _PLAIN_QUERY)
_PLAIN_RELATIVE = re.compile(rf"([A-Za-z0-9._~-]+(?:/[A-Za-z0-9._~-]+)*/?)({_PLAIN_QUERY})")
_PLAIN_ABSOLUTE = re.compile(_PLAIN_URL.pattern + _PLAIN_QUERY)


def _plain_port(plain: re.Match[str]) -> bool:
    """A plain URL's port (group 2; scheme, group 1) as `canonicalize` writes it."""
    port = plain.group(2)
    return port is None or (int(port) <= 65535 and int(port) != DEFAULT_PORTS[plain.group(1)])


def is_canonical(url: str) -> bool:
    """Whether `canonicalize(url) == url`; the plain URL of a crawl is told without parsing."""
    if len(url) > MAX_URL_LENGTH:
        return False
    plain = _PLAIN_URL.fullmatch(url)
    if plain is not None and _plain_port(plain):
        return True
    return canonicalize(url) == url


def origin_of(canonical: str) -> str | None:
    """scheme://netloc of a canonical URL (as `canonicalize` writes it), else None."""
    scheme, sep, rest = canonical.partition("://")
    if not sep or scheme not in DEFAULT_PORTS:
        return None
    netloc = rest.split("/", 1)[0]
    if not netloc or "?" in netloc or "#" in netloc:
        return None
    return f"{scheme}://{netloc}"


def absolute(base: str, href: str, *, base_origin: str | None = None) -> str | None:
    """`href` found on page `base`, resolved and canonical; None for non-http(s) links and
    those longer than MAX_URL_LENGTH. `base_origin` (`origin_of(base)`, when `base` is
    canonical) lets the usual plain links skip parsing: a page holds dozens to hundreds,
    and parsing each cost more than the page's HTML parse."""
    if len(href) > _MAX_INPUT:
        return None
    link = _absolute(base, href, base_origin)
    return link if link is None or len(link) <= MAX_URL_LENGTH else None


def _absolute(base: str, href: str, base_origin: str | None) -> str | None:
    href = href.strip()
    if not href or href.startswith("#"):
        return None
    head = href.partition("#")[0]  # canonical URLs have none
    if base_origin is not None:
        if head.startswith("/"):
            if _PLAIN_ROOTED.fullmatch(head):
                return base_origin + head
        elif (plain := _PLAIN_RELATIVE.fullmatch(head)) is not None:
            path = base[len(base_origin) :].partition("?")[0]
            directory = path[: path.rfind("/") + 1]
            # urljoin drops the base's empty segments before it resolves "..": so must we.
            if "//" not in directory:
                joined = _remove_dot_segments(directory + plain.group(1))
                if _PLAIN_PATH.fullmatch(joined):
                    return base_origin + joined + plain.group(2)
    plain = _PLAIN_ABSOLUTE.fullmatch(head)
    if plain is not None and _plain_port(plain):
        return head
    try:
        joined = urljoin(base, unquote_spaces(href))
    except ValueError:
        return None
    return canonicalize(joined)


def unquote_spaces(href: str) -> str:
    """Authors write raw spaces and newlines in links; browsers drop newlines and tabs and
    escape spaces."""
    return href.replace("\n", "").replace("\r", "").replace("\t", "").replace(" ", "%20")
