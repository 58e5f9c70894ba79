"""What every backend does to a batch of schedules before applying it, and the checks of
what callers of a backend itself give it (App checks its own before)."""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import replace

from .. import checks
from ..errors import ConfigError
from ..types import Failure, Leases, Mode, Schedule, lease_of
from .base import MAX_ROBOTS_ANSWER


def check_schedule(item: Schedule) -> None:
    """ConfigError for a schedule no backend can store as every backend would: App.prepare
    makes only sound ones; this is for callers of a backend itself, before anything changes
    (a Lua error undoes nothing; SQLite took an infinite due time, a priority of 1.5 or beyond
    2**53). Cheap (a bulk schedule checks 10,000 at a time): on Redis, text that is not UTF-8
    fails msgpack's packing, before the call."""
    payload = item.payload
    if not (
        type(item.queue) is str
        and type(item.key) is str
        and type(item.group) is str
        and (payload is None or type(payload) is str)
    ):
        raise ConfigError(f"queue, key, group and payload must be text: {item!r}")
    checks.finite(item.due, "due")
    checks.integer(item.priority, "priority")
    if type(item.mode) is not Mode:
        raise ConfigError(f"mode must be a Mode, got {item.mode!r}")


def check_failures(failures: Iterable[Failure]) -> None:
    """ConfigError for a retry at no time: Redis stored a NaN as the element's due time."""
    for failure in failures:
        if failure.retry_at is not None:
            checks.finite(failure.retry_at, "retry_at")


def check_block_until(until: float | None) -> None:
    """ConfigError for a block ending at NaN (infinity is a block for good): SQLite stored it
    as no block, Redis as "nan"."""
    if until is not None and math.isnan(until):
        raise ConfigError(f"a block's until must be a time or None, got {until!r}")


def check_robots_answer(origin: str, answer: bytes, seconds: float) -> None:
    """ConfigError for an answer no backend keeps alike: no origin, no bytes, too large, or
    standing for no time."""
    if type(origin) is not str or not origin:
        raise ConfigError(f"a robots.txt answer needs an origin, got {origin!r}")
    if type(answer) is not bytes or len(answer) > MAX_ROBOTS_ANSWER:
        raise ConfigError(f"a robots.txt answer must be bytes, at most {MAX_ROBOTS_ANSWER:,}")
    if checks.seconds(seconds, "a robots.txt answer's time") == 0:
        raise ConfigError("a robots.txt answer must stand for some time, got 0 seconds")


def check_leases(leases: Leases, queues: Iterable[str]) -> None:
    """ConfigError for a lease of the queues that is no number of seconds: a NaN lease left
    the element running with no lease to run out, on SQLite and (the claim failing after its
    writes) on Redis."""
    for queue in queues:
        checks.seconds(lease_of(leases, queue), f"lease of queue {queue}")


def merge(items: Iterable[Schedule]) -> list[list[Schedule]]:
    """Folds repeated schedules of one element in a batch as if applied one after another,
    into rounds that each hold an element once, to apply in order. Nearly always one round:
    a repeat folds into the element's last schedule, except a move only if earlier (after an
    add only if new) to a time not before that add's. It moves the element if it was there
    already and changes nothing if the add made it: no one schedule does both, so it goes
    to a round of its own, after."""
    rounds: list[dict[tuple[str, str], Schedule]] = [{}]
    last_round: dict[tuple[str, str], int] = {}
    for item in items:
        slot = (item.queue, item.key)
        at = last_round.get(slot)
        if at is None:
            rounds[0][slot] = item
            last_round[slot] = 0
            continue
        folded = _fold(rounds[at][slot], item)
        if folded is not None:
            rounds[at][slot] = folded
            continue
        if at + 1 == len(rounds):
            rounds.append({})
        rounds[at + 1][slot] = item
        last_round[slot] = at + 1
    return [list(round_.values()) for round_ in rounds]


def _fold(prev: Schedule, item: Schedule) -> Schedule | None:
    """One schedule doing what `prev` then `item` do; None if there is none."""
    if item.mode is Mode.OVERWRITE:
        return item
    if item.mode is Mode.ONLY_IF_NEW:
        return prev
    if item.due < prev.due:  # ONLY_IF_EARLIER, to before prev's time
        mode = Mode.OVERWRITE if prev.mode is Mode.OVERWRITE else Mode.ONLY_IF_EARLIER
        return replace(item, mode=mode)
    return None if prev.mode is Mode.ONLY_IF_NEW else prev
