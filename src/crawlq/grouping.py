"""Politeness groups: which group an element counts against (host, registered domain, ...)."""

from __future__ import annotations

import re
import socket
from collections.abc import Callable
from functools import cache, lru_cache
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote, urlsplit

from .errors import InvalidElement
from .types import JSON, GroupBy

#: The group of elements that have none: no limits apply to it.
NO_GROUP = ""

GroupFunction = Callable[[Any], str | None]

if TYPE_CHECKING:
    import tldextract


@cache
def _suffixes() -> tldextract.TLDExtract:
    """The public suffix list snapshot shipped with tldextract: never fetched at run time.
    Imported when first needed: tldextract brings requests with it, a fifth of the time
    every crawlq command took to start, for the domain groups only."""
    import tldextract

    return tldextract.TLDExtract(suffix_list_urls=(), cache_dir=None)


def element_url(element: JSON) -> str | None:
    """The URL an element is about: the element itself, or its "url" field."""
    if isinstance(element, str):
        return element
    if isinstance(element, dict):
        url = element.get("url")
        if isinstance(url, str):
            return url
    return None


def url_host(url: str) -> str:
    """The host of an absolute http(s) URL in one spelling per host, so that no host
    escapes its limits by being written another way: lower case, no trailing dot,
    percent-escapes decoded, international names in IDNA (xn--) form, IPv4 addresses in
    dotted-decimal whatever their spelling (2130706433, 0x7f.1). InvalidElement otherwise."""
    host = _plain_host(url)
    if host is None:
        host = _parsed_host(url)
    return _numeric_host(host, url) if host[-1].isdigit() else host


def _plain_host(url: str) -> str | None:
    """The host of a plain http(s)://host[:port]/... URL, fast; None for anything unusual."""
    match = _PLAIN_URL.match(url)
    return match.group(1).lower() if match else None


_PLAIN_URL = re.compile(
    r"https?://([A-Za-z0-9](?:[A-Za-z0-9.-]*[A-Za-z0-9])?)(?::[0-9]{1,5})?(?=[/?#]|$)"
)


@lru_cache(maxsize=4096)
def _parsed_host(url: str) -> str:
    try:
        parts = urlsplit(url)
        host = parts.hostname
        parts.port  # noqa: B018 - raises ValueError for a bad port
    except ValueError as exc:
        raise InvalidElement(f"malformed URL {url!r}: {exc}") from exc
    if parts.scheme.lower() not in ("http", "https"):
        raise InvalidElement(f"URL {url!r} must be absolute http or https")
    host = unquote(host or "").rstrip(".")
    if not host:
        raise InvalidElement(f"URL {url!r} has no host")
    if any(c <= " " or c in "/?#@\\%" for c in host):
        raise InvalidElement(f"URL {url!r}: the host has characters no host name has")
    if not host.isascii() and ":" not in host:
        try:
            host = host.encode("idna").decode("ascii")
        except UnicodeError as exc:
            raise InvalidElement(f"URL {url!r}: host is not a valid name ({exc})") from exc
    return host.lower()


_IPV4_LABEL = re.compile(r"^(?:0[xX][0-9a-fA-F]*|[0-9]+)$")


@lru_cache(maxsize=4096)
def _numeric_host(host: str, url: str) -> str:
    """A host whose last label is a number is an IPv4 address (as browsers read it)."""
    if ":" in host or not _IPV4_LABEL.match(host.rsplit(".", 1)[-1]):
        return host
    try:
        return socket.inet_ntoa(socket.inet_aton(host))
    except OSError:
        raise InvalidElement(f"URL {url!r}: {host!r} is not a valid IPv4 address") from None


def group_name(name: str) -> str:
    """`name` in the one spelling of group names, whoever wrote it: lower case, no trailing
    dot, each label that is not ASCII in its IDNA (xn--) form, as `url_host` spells hosts.
    The names a task's group function returns, limit patterns and the groups typed on the
    command line all pass here, so that `Partner-A` or `bücher.de` means the same group
    wherever it is written. A label IDNA cannot encode stays as it is, in lower case."""
    return _normal_name(name, wildcards="")


def group_pattern(pattern: str) -> str:
    """A limit pattern in the spelling of the names it should match (`group_name`); labels
    holding a wildcard (* ? [) are only lower-cased."""
    return _normal_name(pattern, wildcards="*?[")


def bounded_glob(pattern: str) -> str | None:
    """`pattern` with each run of * made one *; None if it then holds more than one * before
    its end. Redis matches globs (limit rules, the dashboard's search) by backtracking: one
    * before the end costs at most a name's length squared, but each more multiplies that by
    the length, and `*?*?*?*?*?*?*?*?#` took seconds over one name, 12 pairs minutes, with the
    server (and every worker) held meanwhile."""
    pattern = _STARS.sub("*", pattern)
    return pattern if pattern.rstrip("*").count("*") <= 1 else None


_STARS = re.compile(r"\*{2,}")


def _normal_name(name: str, wildcards: str) -> str:
    lowered = name.lower()
    if not lowered.isascii():
        lowered = ".".join(
            _idna_label(label) if not any(c in wildcards for c in label) else label
            for label in _LABEL_DOTS.split(lowered)
        )
    if lowered.endswith("."):
        stripped = lowered.rstrip(".")
        # "*." and "a[.]." are patterns whose trailing dot is part of what they match
        if stripped and stripped[-1] not in "*?[]":
            return stripped
    return lowered


#: The dots IDNA separates labels with (as Python's idna codec and browsers read them).
_LABEL_DOTS = re.compile("[.\u3002\uff0e\uff61]")


def _idna_label(label: str) -> str:
    if label.isascii():
        return label
    try:
        return label.encode("idna").decode("ascii")
    except UnicodeError:
        return label


@lru_cache(maxsize=65536)
def registered_domain(host: str) -> str:
    """example.co.uk for a.b.example.co.uk; an IP address or a bare name stays as it is."""
    parts = _suffixes()(host)
    if parts.domain and parts.suffix:
        return f"{parts.domain}.{parts.suffix}"
    return host


@lru_cache(maxsize=4096)
def is_public_suffix(name: str) -> bool:
    """Whether `name` is one under which anyone may register names: com, co.uk, github.io (the
    public suffix list, its private part included), or a one-label name (test, localhost),
    as browsers take any top-level name they do not know."""
    name = name.strip(".").lower()
    return "." not in name or not _suffixes()(name, include_psl_private_domains=True).domain


def group_of(element: JSON, group_by: GroupBy, function: GroupFunction | None = None) -> str:
    """The group key of an element; elements that carry no URL are in no group."""
    if group_by is GroupBy.NONE:
        return NO_GROUP
    if group_by is GroupBy.CUSTOM:
        if function is None:
            raise InvalidElement("this queue derives groups with Python code of its task")
        group = function(element)
        # not a str: check_group names what the function returned
        return group_name(group) if isinstance(group, str) else group or NO_GROUP
    url = element_url(element)
    if url is None:
        return NO_GROUP
    host = url_host(url)
    return host if group_by is GroupBy.HOST else registered_domain(host)
