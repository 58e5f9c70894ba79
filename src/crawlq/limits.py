"""Glob rules that give each group its Limit: the most specific matching pattern wins."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from fnmatch import fnmatchcase

from .errors import ConfigError
from .grouping import bounded_glob, group_pattern
from .types import Limit, LimitRule

DEFAULT_PATTERN = "*"
#: A sensible politeness for any host nobody configured: a few requests at once, no delay.
DEFAULT_LIMIT = Limit(concurrency=4, interval=0.0)
#: The group of elements without one is never limited.
UNLIMITED = Limit()

_WILDCARDS = frozenset("*?[")


def specificity(pattern: str) -> tuple[int, int]:
    """Patterns with more literal characters are more specific; fewer wildcards break ties."""
    wild = sum(1 for ch in pattern if ch in _WILDCARDS)
    return (len(pattern) - wild, -wild)


def check_pattern(pattern: str) -> str:
    """`pattern` spelled as the group names it matches are (`grouping.group_name`: lower
    case, IDNA, no trailing dot), so that `Partner-A` limits the group a task's function
    names Partner-A, and `bücher.de` the host of http://bücher.de/; runs of * made one, and
    more than one * before its end refused (`grouping.bounded_glob`)."""
    if not pattern or pattern != pattern.strip():
        raise ConfigError(f"limit pattern {pattern!r} must be a non-empty glob without spaces")
    bounded = bounded_glob(group_pattern(pattern))
    if bounded is None:
        raise ConfigError(
            f"limit pattern {pattern!r} holds more than one * before its end: matching such a"
            " glob can take Redis minutes a name (as in *.example.com, shop.*, *shop*: one)"
        )
    return bounded


def is_exact(pattern: str) -> bool:
    """Whether `pattern` matches one name only, itself: a rule for one host. Backends keep
    those by name, so that resolving a group or setting such a rule costs the same with
    100,000 of them as with none."""
    return _WILDCARDS.isdisjoint(pattern)


def resolve(group: str, rules: Iterable[LimitRule]) -> Limit:
    """The limit of `group` under `rules` (any order); DEFAULT_LIMIT if none matches."""
    best: LimitRule | None = None
    for rule in rules:
        if fnmatchcase(group, rule.pattern) and (
            best is None or specificity(rule.pattern) > specificity(best.pattern)
        ):
            best = rule
    return best.limit if best else DEFAULT_LIMIT


class RuleIndex:
    """Rules indexed for resolving many groups: exact names looked up, globs scanned. No glob
    ties with an exact rule (it has fewer literal characters or a wildcard), so `resolve`
    gives what the plain function does."""

    def __init__(self, rules: Iterable[LimitRule]) -> None:
        self.exact: dict[str, LimitRule] = {}
        self.globs: list[LimitRule] = []
        for rule in rules:
            if is_exact(rule.pattern):
                self.exact[rule.pattern] = rule
            else:
                self.globs.append(rule)

    def __len__(self) -> int:
        return len(self.exact) + len(self.globs)

    def resolve(self, group: str) -> Limit:
        return resolve_indexed(group, self.exact.get(group), self.globs)


def resolve_indexed(group: str, exact: LimitRule | None, globs: list[LimitRule]) -> Limit:
    """`resolve` given the group's exact rule (None if it has none) and every glob rule."""
    return resolve(group, globs if exact is None else [exact, *globs])


def merged(stored: LimitRule | None, new: LimitRule) -> LimitRule | None:
    """What storing `new` leaves for its pattern, given the rule `stored` there (None: keep
    `stored`). An operator's rule outlasts the app's, which every worker stores again when it
    starts: a host slowed down by hand stays slow until `crawlq limits delete` gives it back
    to the code."""
    if stored is None or new.origin == "operator" or stored.origin == "app":
        return new
    return None


def at_least(limit: Limit, crawl_delay: float) -> Limit:
    """`limit` with its interval raised to a host's robots.txt Crawl-delay. A Crawl-delay is
    a floor under whatever rule gives the group its limit, not a rule of its own: as an exact
    rule it would outrank every glob, and an operator's later '*.example.com' or the app's
    new '*' concurrency would never reach the host."""
    if limit.interval >= crawl_delay:
        return limit
    return Limit(concurrency=limit.concurrency, interval=crawl_delay)


def checked_crawl_delays(delays: Mapping[str, float]) -> dict[str, float]:
    """`delays` as backends store them (Backend.raise_crawl_delays); ValueError for the group
    of elements without one ('', never limited) or a delay that is no interval."""
    for name, seconds in delays.items():
        if not name:
            raise ValueError("a Crawl-delay needs a group: elements without one are never limited")
        Limit(interval=seconds)
    return {name: float(seconds) for name, seconds in delays.items()}
