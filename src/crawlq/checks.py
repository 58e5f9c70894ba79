"""Checks of what people give crawlq (numbers, names, text), with errors that name the setting.

The bounds, and why:

- integers the backends compute with (priorities, concurrency) stay within ±EXACT_INT, 2**53 - 1:
  Redis scripts compute in doubles, which hold every integer exactly only up to there, and both
  backends must order and return the same numbers;
- seconds (delays, intervals, leases, block times) are finite and at most MAX_SECONDS, 100 years:
  times then stay far below NEVER (1e300) and keep sub-millisecond precision;
- names (queues, limit patterns, groups typed by hand) are 1 to MAX_NAME printable characters
  without spaces around them;
- all text is valid Unicode: a lone surrogate (what Python makes of bytes that are not UTF-8 in
  a command line or a file name) cannot be stored by either backend.
"""

from __future__ import annotations

import math

from .errors import ConfigError

#: The largest integer a priority or a concurrency may be (and the negative of the smallest).
EXACT_INT = 2**53 - 1
#: The largest number of seconds a delay, interval, lease or block may be: 100 years.
MAX_SECONDS = 100 * 365.25 * 86400
#: The longest name of a queue, limit pattern or group.
MAX_NAME = 255


def _is_finite(value: object) -> bool:
    """An int or float (not a bool) that is neither infinite nor NaN."""
    return not isinstance(value, bool) and isinstance(value, int | float) and math.isfinite(value)


def finite(value: float, what: str) -> float:
    if not _is_finite(value):
        raise ConfigError(f"{what} must be a finite number of seconds, got {value!r}")
    return float(value)


def bounded(value: float, what: str, low: float, high: float, bounds: str) -> float:
    """A finite number from `low` to `high`; `bounds` says which in the error."""
    if not _is_finite(value) or not low <= value <= high:
        raise ConfigError(f"{what} must be a finite number {bounds}, got {value!r}")
    return float(value)


def seconds(value: float, what: str, *, negative: bool = False) -> float:
    """A finite number of seconds within ±MAX_SECONDS; below 0 only if `negative`."""
    value = finite(value, what)
    low = -MAX_SECONDS if negative else 0.0
    if not low <= value <= MAX_SECONDS:
        raise ConfigError(
            f"{what} must be between {low:g} and {MAX_SECONDS:g} seconds (100 years), got {value:g}"
        )
    return value


def integer(value: int, what: str, *, low: int = -EXACT_INT) -> int:
    """An int (not a bool) between `low` and EXACT_INT."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(f"{what} must be an integer, got {value!r}")
    if value < low:
        raise ConfigError(f"{what} must be at least {low}, got {value}")
    if value > EXACT_INT:
        raise ConfigError(f"{what} must be at most {EXACT_INT} (2**53 - 1), got {value}")
    return value


def unicode_error(text: str) -> str | None:
    """What makes `text` unstorable (a lone surrogate and where), or None if it is fine."""
    try:
        text.encode()
    except UnicodeEncodeError as exc:
        return f"not valid Unicode: lone surrogate {text[exc.start]!r} at character {exc.start}"
    return None


def text(value: object, what: str) -> str:
    """A str that is valid Unicode."""
    if not isinstance(value, str):
        raise ConfigError(f"{what} must be text, got {type(value).__name__}")
    problem = unicode_error(value)
    if problem:
        raise ConfigError(f"{what} {shorten(value)} is {problem}")
    return value


def name(value: object, what: str) -> str:
    """A queue name, limit pattern or group: 1 to MAX_NAME printable characters, no spaces
    around them, valid Unicode."""
    value = text(value, what)
    if not value or len(value) > MAX_NAME:
        raise ConfigError(f"{what} must have 1 to {MAX_NAME} characters, got {len(value)}")
    if not value.isprintable() or value != value.strip():
        raise ConfigError(
            f"{what} {shorten(value)} must be printable characters without spaces around them"
        )
    return value


def shorten(value: str, limit: int = 80) -> str:
    """`repr(value)`, cut to about `limit` characters for an error message."""
    shown = repr(value)
    return (
        shown if len(shown) <= limit else f"{shown[: limit - 5]}...{shown[-1]} ({len(value)} chars)"
    )
