"""Glob rules that give each group its Limit: the most specific matching pattern wins."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace
from fnmatch import fnmatchcase

from .errors import ConfigError
from .grouping import group_pattern
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
    names Partner-A, and `bücher.de` the host of http://bücher.de/."""
    if not pattern or pattern != pattern.strip():
        raise ConfigError(f"limit pattern {pattern!r} must be a non-empty glob without spaces")
    return group_pattern(pattern)


def is_exact(pattern: str) -> bool:
    """Whether `pattern` matches one name only, itself: a rule for one host, as a crawl sets
    for each Crawl-delay it reads. Backends keep those by name, so that resolving a group or
    setting such a rule costs the same with 100,000 of them as with none."""
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
    to the code. A crawl's rule holds a Crawl-delay, which the app's rule may not undercut."""
    if stored is None or new.origin == "operator" or stored.origin == "app":
        return new
    if new.origin == "crawl":  # raising an operator's rule keeps it the operator's
        return replace(new, origin=stored.origin)
    if stored.origin == "operator":
        return None
    if new.limit.interval >= stored.limit.interval:
        return new
    limit = Limit(concurrency=new.limit.concurrency, interval=stored.limit.interval)
    return LimitRule(pattern=new.pattern, limit=limit, origin="crawl")
