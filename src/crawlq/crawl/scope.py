"""Which URLs a crawl may visit: allowed domains, include and exclude patterns, depth."""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field

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
        """Why `url` is out of scope, or None if it is in. A URL whose host no request can go
        to (1.2.3.4.5, a%20b.example.org) is not: its element could not be queued, and
        would fail the page that found it."""
        refused = self._refusal(url)
        return None if refused is None else refused[1]

    def _refusal(self, url: str) -> tuple[Reason, str] | None:
        try:
            host = url_host(url)
        except CrawlqError as exc:
            return Reason.BAD_RESPONSE, f"no host a request can go to: {exc}"
        if self._domains and not self._allows(host):
            return Reason.OUT_OF_SCOPE, f"host {host} is not in the allowed domains"
        if self._include and not any(p.search(url) for p in self._include):
            return Reason.OUT_OF_SCOPE, "matches no include pattern"
        for pattern in self._exclude:
            if pattern.search(url):
                return Reason.OUT_OF_SCOPE, f"matches exclude pattern {pattern.pattern!r}"
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
        """A fetcher hop check: raises FetchError(OUT_OF_SCOPE). A hop to a URL no request
        can go to is left to the politeness, which takes it as a bad response of the page
        whose redirect led there (`politeness.hop_host`)."""
        refused = self._refusal(url)
        if refused is not None and refused[0] is Reason.OUT_OF_SCOPE:
            raise FetchError(Reason.OUT_OF_SCOPE, url, refused[1])

    def follows(self, depth: int) -> bool:
        """Whether links found at `depth` are followed."""
        return self.max_depth is None or depth < self.max_depth


def _compile(patterns: Iterable[str], what: str) -> tuple[re.Pattern[str], ...]:
    compiled = []
    for pattern in patterns:
        try:
            compiled.append(re.compile(pattern))
        except re.error as exc:
            raise ConfigError(f"{what} pattern {pattern!r}: {exc}") from None
    return tuple(compiled)
