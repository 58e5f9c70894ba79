"""Glob rules that give each group its Limit: the most specific matching pattern wins."""

from __future__ import annotations

from fnmatch import fnmatchcase

from .errors import ConfigError
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
    if not pattern or pattern != pattern.strip():
        raise ConfigError(f"limit pattern {pattern!r} must be a non-empty glob without spaces")
    return pattern.lower()


def resolve(group: str, rules: list[LimitRule]) -> Limit:
    """The limit of `group` under `rules` (any order); DEFAULT_LIMIT if none matches."""
    best: LimitRule | None = None
    for rule in rules:
        if fnmatchcase(group, rule.pattern) and (
            best is None or specificity(rule.pattern) > specificity(best.pattern)
        ):
            best = rule
    return best.limit if best else DEFAULT_LIMIT
