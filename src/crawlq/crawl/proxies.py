"""The egress proxies of a fetcher, taken in turn; one that cannot be reached is left out for
a while, so a dead proxy in a rotating set does not fail every Nth request, each blamed on
the site it was for."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

#: A proxy that could not be reached is left out this long, doubled with each failure in a
#: row up to PAUSE_CAP; while every proxy is left out, the one back soonest is used.
PAUSE = 5.0
PAUSE_CAP = 300.0


class Proxies:
    def __init__(self, urls: Sequence[str], clock: Callable[[], float] = time.monotonic) -> None:
        if not urls:
            raise ValueError("no proxies")
        self.urls = tuple(urls)
        self._clock = clock
        self._turn = 0
        self._failures: dict[str, int] = {}
        self._back_at: dict[str, float] = {}  # of the proxies left out

    def __len__(self) -> int:
        return len(self.urls)

    def next(self) -> str:
        """The next proxy in turn that is not left out."""
        now = self._clock()
        for _ in range(len(self.urls)):
            proxy = self.urls[self._turn]
            self._turn = (self._turn + 1) % len(self.urls)
            if self._back_at.get(proxy, 0.0) <= now:
                return proxy
        return min(self._back_at, key=self._back_at.__getitem__)

    def failed(self, proxy: str) -> None:
        failures = self._failures[proxy] = self._failures.get(proxy, 0) + 1
        self._back_at[proxy] = self._clock() + min(PAUSE_CAP, PAUSE * 2 ** (failures - 1))

    def worked(self, proxy: str) -> None:
        if proxy in self._failures:
            del self._failures[proxy]
            self._back_at.pop(proxy, None)
