"""The backend interface: every queue operation the task API, worker and CLI need.

Backends apply SPEC section 3 identically; `tests/test_conformance.py` proves it for each.
Times are seconds since the epoch from the backend's clock, so tests can drive it.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from typing import Protocol

from ..types import (
    Claimed,
    ClaimResult,
    DeadLetter,
    ElementInfo,
    Failure,
    GroupStats,
    Leases,
    LimitRule,
    QueueConfig,
    QueueStats,
    Schedule,
    ScheduleResult,
    WorkerInfo,
)
from ..wakeup import Listener

#: A worker is gone when it missed this many seconds of heartbeats (every backend).
WORKER_TTL = 120.0
#: The largest robots.txt answer a backend keeps (`keep_robots_answer`), in bytes.
MAX_ROBOTS_ANSWER = 64 * 1024


class Backend(Protocol):
    url: str

    @property
    def epoch(self) -> int:
        """Changes when the backend finds that writes it confirmed may be gone: Redis came
        back from a crash (see `backends/redis/restarts.py`). What a process remembers of
        its own writes holds only within one epoch."""

    def now(self) -> float:
        """The backend's clock, in seconds since the epoch."""

    async def open(self) -> None: ...

    async def close(self) -> None: ...

    async def listen(self, queues: Sequence[str]) -> Listener:
        """A wake-up listener for an idle worker of these queues, bound to the running event
        loop: set when one of them may have work to claim sooner than the worker thought."""

    async def ensure_queues(self, configs: Sequence[QueueConfig]) -> None:
        """Creates or updates queues; their settings are stored for tools without task code."""

    async def queues(self) -> list[QueueConfig]: ...

    async def schedule(self, items: Sequence[Schedule]) -> ScheduleResult:
        """Adds or moves elements, all in one atomic step and one round trip (on Redis, one
        for each 5,000: a Lua function holds the whole server while it runs)."""

    async def claim(
        self, queues: Sequence[str], *, worker: str, limit: int, lease: Leases
    ) -> ClaimResult:
        """Leases up to `limit` claimable elements: due, group slot free, interval passed;
        each for `lease` seconds, or for its queue's in `lease`."""

    async def ack(self, elements: Sequence[Claimed]) -> None: ...

    async def fail(self, failures: Sequence[Failure]) -> None: ...

    async def finish(
        self, follow: Sequence[Schedule], acks: Sequence[Claimed], failures: Sequence[Failure]
    ) -> None:
        """What a worker finished since its last write: the follow-up work its tasks asked to
        schedule with their acks first, then the acks and failures. SQLite writes all of it in
        one transaction. Redis writes it in that order, so an ack is never written without its
        follow-ups; should it fail midway, the worker writes all of it again, so follow-ups
        are written at least once, as tasks run at least once."""

    async def release(self, elements: Sequence[Claimed]) -> None:
        """Returns unfinished elements to their queue at once, the attempt not counted."""

    async def heartbeat(
        self, worker: WorkerInfo, elements: Sequence[Claimed], lease: Leases
    ) -> None:
        """Extends the leases of `elements` and records that `worker` is alive."""

    async def register_worker(self, worker: WorkerInfo) -> None: ...

    async def unregister_worker(self, worker_id: str) -> None: ...

    async def workers(self) -> list[WorkerInfo]: ...

    async def limits(self) -> list[LimitRule]: ...

    async def set_limits(self, rules: Sequence[LimitRule]) -> None:
        """Adds or replaces rules; every group's limits follow at once, no restart needed."""

    async def delete_limit(self, pattern: str) -> bool:
        """Removes the rule for `pattern`, and the Crawl-delay of a group so named; whether
        there was either."""

    async def crawl_delays(self, groups: Collection[str] | None = None) -> dict[str, float]:
        """Each group's Crawl-delay (`raise_crawl_delays`), by name: of every group, or of
        those of `groups` that have one."""

    async def raise_crawl_delays(self, delays: Mapping[str, float]) -> None:
        """Each named group's interval is at least its delay from now on, whatever rule gives
        it its limit (a host's robots.txt Crawl-delay). Never lowers one."""

    async def robots_answer(self, origin: str) -> tuple[bytes, float] | None:
        """What a worker made of `origin`'s robots.txt (`keep_robots_answer`) and for how
        many more seconds it stands; None when no answer stands."""

    async def keep_robots_answer(self, origin: str, answer: bytes, seconds: float) -> None:
        """Keeps `answer` for every worker on every machine for `seconds` (replacing one
        kept before), so that robots.txt is fetched once per origin, not once per process.
        Up to MAX_ROBOTS_ANSWER bytes."""

    async def block_group(self, group: str, until: float | None, reason: str | None) -> None:
        """No element of `group` starts before `until`; None lifts the block."""

    async def reserve_send(self, group: str, gap: float, earliest: float = 0.0) -> float:
        """Reserves the next request to `group` for every worker on every machine: at
        least `gap` seconds after the previous reservation and `earliest` seconds from now.
        Returns how many seconds from now the reserved time is (0: at once). The claim
        spaces the starts of elements; this spaces the requests they send, which leave a
        variable few milliseconds after their claims."""

    async def reserve_send_slot(
        self,
        group: str,
        gap: float,
        earliest: float = 0.0,
        *,
        replacing: float | None = None,
        max_wait: float | None = None,
    ) -> tuple[float, float, bool]:
        """`reserve_send`, returning (the reserved time by the backend's clock, seconds from
        now to it, whether `replacing` was kept). With `replacing`, a time this method
        returned before for `group`: if it is still the group's latest reservation, it is
        kept and moves to `earliest` seconds from now (never earlier), and its request may
        go from its old time on, since nobody has reserved after it; otherwise a new time is
        reserved as without it. A request about to be sent late on its reservation, when
        another may have been reserved one gap after it, asks this instead of sending.

        With `max_wait`, a new time more than `max_wait` seconds away is returned but not
        reserved: its request is put back until then, and a reservation it left behind would
        push the next one a gap further, again and again."""

    async def queue_stats(self, queues: Sequence[str] | None = None) -> list[QueueStats]: ...

    async def group_stats(
        self, pattern: str = "*", *, limit: int = 100, include_idle: bool = False
    ) -> list[GroupStats]: ...

    async def element(self, queue: str, key: str) -> ElementInfo | None:
        """One element's current state by its key (canonical JSON or the task's key), whether
        queued, running or dead; None when the queue holds no such element."""

    async def worker_elements(self, worker_id: str, *, limit: int = 50) -> list[ElementInfo]:
        """Up to `limit` elements the worker holds now."""

    async def check(self) -> list[str]:
        """Every broken internal invariant, as a sentence; empty when consistent. Reads the
        whole store: for tests and `crawlq check`, on a quiet queue."""

    async def dead_letters(
        self, queue: str, *, limit: int = 100, offset: int = 0
    ) -> list[DeadLetter]: ...

    async def requeue_dead(self, queue: str, keys: Sequence[str] | None = None) -> int: ...

    async def purge_dead(self, queue: str, keys: Sequence[str] | None = None) -> int: ...
