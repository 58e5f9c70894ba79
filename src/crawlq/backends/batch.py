"""What every backend does to a batch of schedules before applying it."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace

from ..types import Mode, Schedule


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
