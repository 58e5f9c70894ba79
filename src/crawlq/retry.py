"""When a failed element runs again: exponential backoff with full jitter, bounded."""

from __future__ import annotations

import math
import random
from dataclasses import dataclass


@dataclass(frozen=True, kw_only=True, slots=True)
class Retry:
    """`max_attempts` runs in all; the n-th retry waits up to base * factor**(n-1), capped."""

    max_attempts: int = 5
    base: float = 1.0
    factor: float = 2.0
    cap: float = 600.0
    jitter: float = 0.5

    def __post_init__(self) -> None:
        if self.max_attempts < 1:
            raise ValueError(f"max_attempts must be at least 1, got {self.max_attempts}")
        if self.base < 0 or self.factor < 1 or self.cap < 0 or not 0 <= self.jitter <= 1:
            raise ValueError("backoff needs base >= 0, factor >= 1, cap >= 0, 0 <= jitter <= 1")

    def exhausted(self, attempt: int) -> bool:
        return attempt >= self.max_attempts

    def delay(self, attempt: int, rng: random.Random | None = None) -> float:
        """Seconds to wait after the `attempt`-th run failed; the jitter spreads a burst."""
        n = max(0, attempt - 1)
        if self.base == 0 or self.cap <= self.base:
            ceiling = min(self.cap, self.base)
        elif self.factor > 1 and n * math.log(self.factor) >= math.log(self.cap / self.base):
            ceiling = self.cap  # factor ** n itself would overflow past ~1,000 attempts
        else:
            ceiling = min(self.cap, self.base * self.factor**n)
        spread = (rng or random).random() * self.jitter * ceiling
        return ceiling - spread
