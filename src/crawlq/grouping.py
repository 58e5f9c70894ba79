"""Politeness groups: which group an element counts against (host, registered domain, ...)."""

from __future__ import annotations

import re
from collections.abc import Callable
from functools import lru_cache
from typing import Any
from urllib.parse import urlsplit

import tldextract

from .errors import InvalidElement
from .types import JSON, GroupBy

#: The group of elements that have none: no limits apply to it.
NO_GROUP = ""

GroupFunction = Callable[[Any], str | None]

# The public suffix list snapshot shipped with tldextract: never fetched at run time.
_suffixes = tldextract.TLDExtract(suffix_list_urls=(), cache_dir=None)


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
    """The lower-case host of an absolute http(s) URL; InvalidElement otherwise."""
    host = _plain_host(url)
    return host if host is not None else _parsed_host(url)


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
    if not host:
        raise InvalidElement(f"URL {url!r} has no host")
    return host


@lru_cache(maxsize=65536)
def registered_domain(host: str) -> str:
    """example.co.uk for a.b.example.co.uk; an IP address or a bare name stays as it is."""
    parts = _suffixes(host)
    if parts.domain and parts.suffix:
        return f"{parts.domain}.{parts.suffix}"
    return host


def group_of(element: JSON, group_by: GroupBy, function: GroupFunction | None = None) -> str:
    """The group key of an element; elements that carry no URL are in no group."""
    if group_by is GroupBy.NONE:
        return NO_GROUP
    if group_by is GroupBy.CUSTOM:
        if function is None:
            raise InvalidElement("this queue derives groups with Python code of its task")
        return function(element) or NO_GROUP
    url = element_url(element)
    if url is None:
        return NO_GROUP
    host = url_host(url)
    return host if group_by is GroupBy.HOST else registered_domain(host)
