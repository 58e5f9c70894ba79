"""Checks of numbers given by people, with errors that name the setting."""

from __future__ import annotations

import math

from .errors import ConfigError

#: SQLite and Redis both store integers as signed 64-bit.
INT64 = (-(2**63), 2**63 - 1)


def finite(value: float, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ConfigError(f"{what} must be a finite number of seconds, got {value!r}")
    return float(value)


def int64(value: int, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(f"{what} must be an integer, got {value!r}")
    if not INT64[0] <= value <= INT64[1]:
        raise ConfigError(f"{what} must fit in 64 bits, got {value}")
    return value
