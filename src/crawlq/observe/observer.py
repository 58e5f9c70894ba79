"""What the dashboard and `/metrics` read from a backend, cached briefly and sampled over time.

Every read is one of the backend's summary calls (per-queue counters, the busiest groups, the
worker registry), never a scan of elements. Reads are cached for `ttl` seconds and shared by
concurrent requests, so a dashboard left open in many tabs, or scraped often, costs the
backend at most one read of each kind per `ttl`. A sampler keeps the per-queue counts of the
last minutes for the rate charts.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Generic, TypeVar

from ..backends import Backend
from ..types import DeadLetter, GroupStats, QueueStats, WorkerInfo
from .metrics import Snapshot

T = TypeVar("T")

#: Groups read from the backend for the groups page and `/metrics`, busiest first.
GROUP_ROWS = 200
SAMPLE_EVERY = 2.0
#: Samples kept: 10 minutes at one every 2 s.
SAMPLES = 300
SLOW_READ_FACTOR = 10.0


@dataclass(frozen=True, slots=True)
class Sample:
    at: float
    queues: dict[str, QueueStats]


class _Cached(Generic[T]):
    """One value read at most once per `ttl`, or per SLOW_READ_FACTOR times the last read's
    duration if that is longer (so a slow backend read, such as Redis's group scan, which
    blocks the server, takes at most a tenth of its time); concurrent readers share a read."""

    def __init__(self, read: Callable[[], Awaitable[T]], ttl: float) -> None:
        self._read = read
        self._base = self._ttl = ttl
        self._value: T | None = None
        self._at = -1e300
        self._lock = asyncio.Lock()

    def _fresh(self) -> bool:
        return self._value is not None and time.monotonic() - self._at < self._ttl

    async def get(self) -> T:
        if self._fresh() and self._value is not None:
            return self._value
        async with self._lock:
            if not self._fresh() or self._value is None:
                started = time.monotonic()
                self._value = await self._read()
                self._at = time.monotonic()
                if self._base > 0:  # 0: never reuse (benchmarks)
                    self._ttl = max(self._base, SLOW_READ_FACTOR * (self._at - started))
            return self._value


class Observer:
    """A backend seen by the dashboard: cached summaries and a short history of queue counts."""

    def __init__(self, backend: Backend, *, ttl: float = 1.0) -> None:
        self.backend = backend
        self.ttl = ttl
        self._queues = _Cached(self._read_queues, ttl)
        self._workers = _Cached(self.backend.workers, ttl)
        self._groups: dict[str, _Cached[list[GroupStats]]] = {}
        self.samples: deque[Sample] = deque(maxlen=SAMPLES)
        self._sampler: asyncio.Task[None] | None = None

    async def _read_queues(self) -> list[QueueStats]:
        stats = await self.backend.queue_stats()
        self._remember(stats)
        return stats

    def _remember(self, stats: list[QueueStats]) -> None:
        now = self.backend.now()
        if self.samples and now - self.samples[-1].at < SAMPLE_EVERY / 2:
            return
        self.samples.append(Sample(at=now, queues={q.name: q for q in stats}))

    async def queues(self) -> list[QueueStats]:
        return await self._queues.get()

    async def workers(self) -> list[WorkerInfo]:
        return await self._workers.get()

    async def groups(self, pattern: str = "*") -> list[GroupStats]:
        """The busiest groups matching `pattern` (a glob), most queued first."""
        cached = self._groups.get(pattern)
        if cached is None:
            if len(self._groups) > 64:
                self._groups.clear()

            async def read() -> list[GroupStats]:
                found = await self.backend.group_stats(pattern, limit=GROUP_ROWS)
                return sorted(found, key=lambda g: (-g.queued, -g.running, g.name))

            cached = self._groups[pattern] = _Cached(read, self.ttl)
        return await cached.get()

    async def snapshot(self) -> Snapshot:
        queues, groups, workers = await asyncio.gather(self.queues(), self.groups(), self.workers())
        return Snapshot(at=self.backend.now(), queues=queues, groups=groups, workers=workers)

    async def dead_letters(self, queue: str, *, limit: int, offset: int) -> list[DeadLetter]:
        return await self.backend.dead_letters(queue, limit=limit, offset=offset)

    def series(self, queue: str, minutes: float = 10.0) -> list[tuple[float, QueueStats]]:
        """The sampled counts of `queue` over the last `minutes`, oldest first."""
        if not self.samples:
            return []
        since = self.samples[-1].at - minutes * 60
        return [
            (s.at, s.queues[queue]) for s in self.samples if s.at >= since and queue in s.queues
        ]

    # -- the sampler ---------------------------------------------------------------------------

    async def start(self) -> None:
        if self._sampler is None:
            self._sampler = asyncio.create_task(self._sample(), name="crawlq-dashboard-sampler")

    async def stop(self) -> None:
        if self._sampler is not None:
            self._sampler.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._sampler
            self._sampler = None

    async def _sample(self) -> None:
        while True:
            with contextlib.suppress(Exception):
                await self.queues()
            await asyncio.sleep(SAMPLE_EVERY)


def rates(series: list[tuple[float, QueueStats]], window: float = 60.0) -> dict[str, float]:
    """Per-second changes over the last `window` seconds of a series: `finished` is the net
    drop of elements (total down, dead up), an estimate when schedules arrive meanwhile."""
    if len(series) < 2:
        return {}
    end_at, end = series[-1]
    start_at, start = next(((t, q) for t, q in series if t >= end_at - window), series[0])
    span = end_at - start_at
    if span <= 0:
        return {}
    return {
        "net": (end.total - start.total) / span,
        "dead": (end.dead - start.dead) / span,
    }
