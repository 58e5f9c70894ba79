"""When a failed element runs again: exponential backoff with full jitter, bounded."""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

from . import checks


@dataclass(frozen=True, kw_only=True, slots=True)
class Retry:
    """`max_attempts` runs in all; the n-th retry waits up to base * factor**(n-1), capped.

    `base` and `cap` are seconds, 0 to 100 years (`checks.MAX_SECONDS`), so an element is
    never put off further than that; `factor` is a finite number, at least 1; `jitter` is the
    share of each delay taken off at random, 0 to 1. Anything else is a ConfigError."""

    max_attempts: int = 5
    base: float = 1.0
    factor: float = 2.0
    cap: float = 600.0
    jitter: float = 0.5

    def __post_init__(self) -> None:
        checks.integer(self.max_attempts, "Retry max_attempts", low=1)
        checks.seconds(self.base, "Retry base")
        checks.seconds(self.cap, "Retry cap")
        checks.bounded(self.factor, "Retry factor", 1.0, math.inf, "at least 1")
        checks.bounded(self.jitter, "Retry jitter", 0.0, 1.0, "between 0 and 1")

    def exhausted(self, attempt: int) -> bool:
        return attempt >= self.max_attempts

    def delay(self, attempt: int, rng: random.Random | None = None) -> float:
        """Seconds to wait after the `attempt`-th run failed; the jitter spreads a burst."""
        n = max(0, attempt - 1)
        if self.base == 0 or self.cap <= self.base:
            ceiling = min(self.cap, self.base)
        elif self.factor > 1 and n * math.log(self.factor) >= math.log(self.cap) - math.log(
            self.base
        ):
            ceiling = self.cap  # factor ** n itself would overflow past ~1,000 attempts
        else:
            try:
                ceiling = min(self.cap, self.base * self.factor**n)
            except OverflowError:  # a base so tiny that factor ** n overflows below the cap
                ceiling = min(self.cap, math.exp(math.log(self.base) + n * math.log(self.factor)))
        spread = (rng or random).random() * self.jitter * ceiling
        return ceiling - spread
