"""The event record the worker-process apps append to and the tests read: one JSON line
per event, written by several processes at once."""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import Any


def read_events(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    text = path.read_text()
    # a worker may be appending a line as this reads: only whole lines count
    return [json.loads(line) for line in text[: text.rfind("\n") + 1].splitlines()]


def peak_overlap(events: list[dict[str, Any]]) -> int:
    """Most elements running at once, from their observed start and end times."""
    edges = sorted(
        [(e["t"], 1) for e in events if e["event"] == "start"]
        + [(e["t"], -1) for e in events if e["event"] == "end"],
        key=lambda edge: (edge[0], edge[1]),
    )
    return max(itertools.accumulate(delta for _, delta in edges), default=0)
