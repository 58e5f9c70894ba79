"""The garbage collector's thresholds for a process that runs tasks.

A crawl allocates a great many short-lived containers (requests, answers, coroutines, a
page's dicts and lists), almost none of them in reference cycles. With CPython's thresholds
(700, 10, 10) the collector ran about 1,800 times in a 10,000-page crawl, 14 of them over
the whole heap, and took 12-17% of the process's CPU (BENCHMARKS.md, twentieth session).
Collecting the youngest generation every 50,000 allocations instead took under 1%: the
cyclic garbage waiting for a collection stays bounded by one young generation, a few MB.
"""

from __future__ import annotations

import gc

THRESHOLDS = (50_000, 20, 10)


def collect_less_often() -> None:
    """Raises this process's collector thresholds to THRESHOLDS: none a program set higher is
    lowered, and a collector a program turned off (threshold 0) stays off."""
    current = gc.get_threshold()
    if current[0] == 0:
        return
    gc.set_threshold(*(max(now, wanted) for now, wanted in zip(current, THRESHOLDS, strict=False)))
