"""What every backend does to a batch of schedules before applying it."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace

from ..types import Mode, Schedule


def merge(items: Iterable[Schedule]) -> dict[tuple[str, str], Schedule]:
    """Folds repeated schedules of one element in a batch as if applied one after another."""
    merged: dict[tuple[str, str], Schedule] = {}
    for item in items:
        slot = (item.queue, item.key)
        prev = merged.get(slot)
        if prev is None or item.mode is Mode.OVERWRITE:
            merged[slot] = item
        elif item.mode is Mode.ONLY_IF_EARLIER and item.due < prev.due:
            mode = Mode.OVERWRITE if prev.mode is Mode.OVERWRITE else Mode.ONLY_IF_EARLIER
            merged[slot] = replace(item, mode=mode)
    return merged
