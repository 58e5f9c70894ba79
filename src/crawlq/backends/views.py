"""Elements as every backend reports them, built from each backend's own fields."""

from __future__ import annotations

from collections.abc import Sequence

from ..types import Attempt, DeadLetter, ElementInfo

#: Element states as stored by both backends: 0 delayed, 1 ready (due), 2 running.
STATE_NAMES = ("delayed", "due", "running")


def live_element(
    *,
    queue: str,
    key: str,
    payload: str,
    group: str,
    state: int,
    due: float,
    priority: int,
    attempts: int,
    lease_until: float | None,
    worker: str | None,
    error: str | None,
    next_due: float | None,
    history: Sequence[Attempt],
    now: float,
) -> ElementInfo:
    name = STATE_NAMES[state]
    if name == "delayed" and due <= now:
        name = "due"  # due, not yet promoted by a claim
    return ElementInfo(
        queue=queue,
        key=key,
        payload=payload,
        group=group,
        state=name,
        due=due,
        priority=priority,
        attempts=attempts,
        lease_until=lease_until,
        worker=worker,
        error=error,
        next_due=next_due,
        history=tuple(history),
    )


def dead_element(letter: DeadLetter, history: Sequence[Attempt]) -> ElementInfo:
    return ElementInfo(
        queue=letter.queue,
        key=letter.key,
        payload=letter.payload,
        group=letter.group,
        state="dead",
        attempts=letter.attempts,
        error=letter.error,
        dead=letter,
        history=tuple(history),
    )
