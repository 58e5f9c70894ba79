"""Which URLs a crawl may visit: allowed domains, include and exclude patterns, depth."""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from ..errors import ConfigError, CrawlqError
from ..grouping import url_host
from .errors import FetchError, Reason


@dataclass(frozen=True, kw_only=True, slots=True)
class Scope:
    """`domains`: hosts allowed with their sub-domains (none given: any host). `include`:
    regular expressions of which a URL must match one (none given: all). `exclude`: regular
    expressions that rule a URL out. `max_depth`: links followed from a seed (None: any)."""

    domains: tuple[str, ...] = ()
    include: tuple[str, ...] = ()
    exclude: tuple[str, ...] = ()
    max_depth: int | None = None
    _include: tuple[re.Pattern[str], ...] = field(init=False, repr=False, compare=False)
    _exclude: tuple[re.Pattern[str], ...] = field(init=False, repr=False, compare=False)
    _domains: frozenset[str] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "domains", tuple(d.lower().strip(".") for d in self.domains))
        object.__setattr__(self, "_include", _compile(self.include, "include"))
        object.__setattr__(self, "_exclude", _compile(self.exclude, "exclude"))
        object.__setattr__(self, "_domains", frozenset(self.domains))
        if self.max_depth is not None and self.max_depth < 0:
            raise ConfigError(f"max_depth must be >= 0, got {self.max_depth}")

    def refusal(self, url: str) -> str | None:
        """Why `url` is out of scope, or None if it is in."""
        if self._domains:
            host = _hostname(url)
            if not self._allows(host):
                return f"host {host} is not in the allowed domains"
        if self._include and not any(p.search(url) for p in self._include):
            return "matches no include pattern"
        for pattern in self._exclude:
            if pattern.search(url):
                return f"matches exclude pattern {pattern.pattern!r}"
        return None

    def _allows(self, host: str) -> bool:
        """`host` is an allowed domain or a sub-domain of one: looked up label by label."""
        domains = self._domains
        while True:
            if host in domains:
                return True
            _, dot, host = host.partition(".")
            if not dot:
                return False

    def check(self, url: str) -> None:
        """A fetcher hop check: raises FetchError(OUT_OF_SCOPE)."""
        refusal = self.refusal(url)
        if refusal is not None:
            raise FetchError(Reason.OUT_OF_SCOPE, url, refusal)

    def follows(self, depth: int) -> bool:
        """Whether links found at `depth` are followed."""
        return self.max_depth is None or depth < self.max_depth


def _hostname(url: str) -> str:
    try:
        return url_host(url)  # fast for the usual URL
    except CrawlqError:
        pass
    try:
        return (urlsplit(url).hostname or "").lower()
    except ValueError:
        return ""


def _compile(patterns: Iterable[str], what: str) -> tuple[re.Pattern[str], ...]:
    compiled = []
    for pattern in patterns:
        try:
            compiled.append(re.compile(pattern))
        except re.error as exc:
            raise ConfigError(f"{what} pattern {pattern!r}: {exc}") from None
    return tuple(compiled)
