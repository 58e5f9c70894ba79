"""Value objects shared by the task API, the worker and every backend."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import Enum
from typing import Literal, Union

from .checks import EXACT_INT, MAX_SECONDS

JSON = Union[None, bool, int, float, str, list["JSON"], dict[str, "JSON"]]  # noqa: UP007

#: Stands for "never" in due times and gates: a float that sorts after every real time.
NEVER = 1e300

#: How long a claim or a heartbeat leases elements: seconds, or seconds by queue (a worker of
#: tasks with different leases leases each element for its own task's).
Leases = Union[float, Mapping[str, float]]  # noqa: UP007


def lease_of(leases: Leases, queue: str) -> float:
    return leases[queue] if isinstance(leases, Mapping) else leases


class Mode(Enum):
    """What `schedule` does when the element is already queued."""

    OVERWRITE = 0
    ONLY_IF_EARLIER = 1
    ONLY_IF_NEW = 2


class GroupBy(Enum):
    """How a queue derives the politeness group of an element."""

    HOST = "host"
    DOMAIN = "domain"
    NONE = "none"
    CUSTOM = "custom"


@dataclass(frozen=True, kw_only=True, slots=True)
class QueueConfig:
    """What a backend stores about a queue, so tools without task code can use it."""

    name: str
    group_by: GroupBy = GroupBy.HOST
    custom_key: bool = False
    seen: bool = False


@dataclass(frozen=True, kw_only=True, slots=True)
class Schedule:
    """One element to add or move, ready for a backend: identity and group already derived."""

    queue: str
    key: str
    payload: str | None
    group: str
    due: float
    priority: int = 0
    mode: Mode = Mode.OVERWRITE
    revisit: bool = False


@dataclass(frozen=True, kw_only=True, slots=True)
class ScheduleResult:
    """How a batch of schedules was applied."""

    added: int = 0
    moved: int = 0
    kept: int = 0
    deferred: int = 0
    skipped_seen: int = 0

    def __add__(self, other: ScheduleResult) -> ScheduleResult:
        return ScheduleResult(
            added=self.added + other.added,
            moved=self.moved + other.moved,
            kept=self.kept + other.kept,
            deferred=self.deferred + other.deferred,
            skipped_seen=self.skipped_seen + other.skipped_seen,
        )


@dataclass(frozen=True, kw_only=True, slots=True)
class Claimed:
    """An element leased to one worker. `attempt` and `claimed_at` together are the lease's
    fencing token."""

    ref: int
    queue: str
    key: str
    payload: str
    group: str
    priority: int
    due: float
    attempt: int
    claimed_at: float
    lease_until: float


@dataclass(frozen=True, kw_only=True, slots=True)
class ClaimResult:
    """Claimed elements, and when more may become claimable if fewer than asked were found."""

    elements: list[Claimed]
    next_at: float | None


@dataclass(frozen=True, kw_only=True, slots=True)
class Failure:
    """A failed run: retried at `retry_at`, or dead-lettered when it is None."""

    element: Claimed
    error: str
    traceback: str = ""
    retry_at: float | None = None

    def __post_init__(self) -> None:
        # Backends store text as UTF-8, which a lone surrogate (from a file name or a
        # header decoded with surrogateescape) cannot be: the store would refuse the
        # failure, and the worker would hand it back again forever.
        for name, text in (("error", self.error), ("traceback", self.traceback)):
            storable = utf8_storable(text)
            if storable is not text:
                object.__setattr__(self, name, storable)


def utf8_storable(text: str) -> str:
    """`text`, its lone surrogates (if any) written as backslash escapes."""
    if text.isascii():
        return text
    try:
        text.encode()
    except UnicodeEncodeError:
        return text.encode("utf-8", "backslashreplace").decode()
    return text


@dataclass(frozen=True, kw_only=True, slots=True)
class Limit:
    """Politeness of a group: at most `concurrency` in flight, starts `interval` s apart
    (concurrency from 1 to 2**53 - 1, interval from 0 to 100 years: see checks.py)."""

    concurrency: int | None = None
    interval: float = 0.0

    def __post_init__(self) -> None:
        concurrency, interval = self.concurrency, self.interval
        if concurrency is not None and (
            isinstance(concurrency, bool)
            or not isinstance(concurrency, int | float)
            or not 1 <= concurrency <= EXACT_INT
        ):
            raise ValueError(
                f"concurrency must be an integer from 1 to {EXACT_INT}, got {concurrency!r}"
            )
        if (
            isinstance(interval, bool)
            or not isinstance(interval, int | float)
            or not 0 <= interval <= MAX_SECONDS
        ):
            raise ValueError(
                f"interval must be a number of seconds from 0 to {MAX_SECONDS:g} (100 years),"
                f" got {interval!r}"
            )


#: Who set a limit rule: the app's code (`App.limit`, stored each time a worker starts) or an
#: operator at run time (`crawlq limits set`). See `limits.merged` for what each may replace.
#: (A crawl's robots.txt Crawl-delay is no rule: Backend.raise_crawl_delays.)
Origin = Literal["app", "operator"]
ORIGINS: tuple[Origin, ...] = ("app", "operator")


@dataclass(frozen=True, kw_only=True, slots=True)
class LimitRule:
    pattern: str
    limit: Limit
    origin: Origin = "app"


@dataclass(frozen=True, kw_only=True, slots=True)
class QueueStats:
    name: str
    total: int
    due: int
    delayed: int
    running: int
    dead: int


@dataclass(frozen=True, kw_only=True, slots=True)
class GroupStats:
    name: str
    queued: int
    running: int
    limit: Limit
    next_start: float | None
    blocked_until: float | None
    block_reason: str | None


@dataclass(frozen=True, kw_only=True, slots=True)
class DeadLetter:
    queue: str
    key: str
    payload: str
    group: str
    attempts: int
    error: str
    traceback: str
    died_at: float


@dataclass(frozen=True, kw_only=True, slots=True)
class WorkerInfo:
    id: str
    host: str
    pid: int
    queues: tuple[str, ...]
    started: float
    heartbeat: float
    running: int = 0
    concurrency: int = 0  # task slots; 0 when unknown
    wake_address: str = field(default="", repr=False)


@dataclass(frozen=True, kw_only=True, slots=True)
class Attempt:
    """One run of an element: its number, when and by whom it was claimed, and how it ended
    (None while it runs: "released", "lease expired", or the error that failed it)."""

    attempt: int
    claimed_at: float
    worker: str
    outcome: str | None = None


@dataclass(frozen=True, kw_only=True, slots=True)
class ElementInfo:
    """One element as the backend holds it now: `state` is delayed, due, running or dead."""

    queue: str
    key: str
    payload: str
    group: str
    state: str
    due: float | None = None
    priority: int = 0
    attempts: int = 0
    lease_until: float | None = None
    worker: str | None = None
    error: str | None = None
    next_due: float | None = None
    dead: DeadLetter | None = None
    history: tuple[Attempt, ...] = ()  # the last attempts, oldest first
