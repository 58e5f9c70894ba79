"""Peer task queues benchmarked against crawlq: Celery, RQ, Dramatiq, arq and Huey.

Each ``<name>_peer`` module defines the three task kinds (``noop``: just mark_done, with
an optional URL argument; ``io``: sleep 50 ms then mark_done; ``late``: mark_late(due),
for the delayed-task lateness), and exposes a module-level ``PEER``: how to enqueue tasks
in bulk, which worker processes to start, with the configuration chosen for each
workload, and a ``Client`` for the Redis comparison (benchmarks.redis_compare): single and
bulk enqueues of URLs, delayed enqueues, a fast fill and the peer's dequeue primitive.
Worker processes learn the Redis URL, the marker and lateness files from the environment
(URL_ENV, common.MARKER_ENV, common.LATENESS_ENV).
"""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, Protocol

#: noop and io are drained (WORKLOADS); late runs delayed tasks for the lateness measure.
Workload = Literal["noop", "io", "late"]
WORKLOADS: tuple[Workload, ...] = ("noop", "io")
NAMES = ("celery", "rq", "dramatiq", "arq", "huey")

#: How long an ``io`` task sleeps.
IO_SLEEP = 0.05
#: Concurrency per process for the ``io`` workload (crawlq runs ~200-500 slots); the
#: environment's IO_CONCURRENCY_ENV sets another, for the peers' worker processes as well.
IO_CONCURRENCY_ENV = "BENCH_IO_CONCURRENCY"
IO_CONCURRENCY = int(os.environ.get(IO_CONCURRENCY_ENV, "200"))
#: Worker processes read the Redis URL from here.
URL_ENV = "BENCH_REDIS_URL"
QUEUE = "bench"


class Client(Protocol):
    """One connection to a peer's Redis, for the Redis comparison's measures."""

    def send_each(self, urls: Sequence[str]) -> None:
        """Enqueue ``noop(url)`` for each URL by its own call, as an application enqueues
        one task at a time."""

    def send_many(self, urls: Sequence[str]) -> None:
        """Enqueue ``noop(url)`` for each URL by the peer's fastest (bulk) path."""

    def send_late(self, due: float, delay: float) -> None:
        """Enqueue ``late(due)`` to run in ``delay`` seconds, by the peer's delay feature."""

    def fill(self, n: int) -> None:
        """Put ``n`` more noop tasks on the queue fast: copies (with fresh ids) of a message
        the peer's own enqueue wrote. Only for the dequeue measure."""

    def dequeue(self, count: int) -> None:
        """Take ``count`` tasks off the queue with the peer's own dequeue primitive."""

    def close(self) -> None: ...


@dataclass(frozen=True)
class Peer:
    name: str
    version: str
    #: enqueue(redis_url, workload, n): put n tasks on the queue, as fast as the peer allows
    enqueue: Callable[[str, Workload, int], None]
    #: worker_commands(redis_url, workload, processes): one argv per subprocess to start
    worker_commands: Callable[[str, Workload, int], list[list[str]]]
    #: config(workload, processes): the configuration used, for the result record
    config: Callable[[Workload, int], dict[str, object]]
    #: client(redis_url): a Client for the Redis comparison
    client: Callable[[str], Client] | None = None
    #: how the Redis comparison's measures run on this peer: measure -> description
    notes: dict[str, str] = field(default_factory=dict)


def redis_url_from_env() -> str:
    return os.environ.get(URL_ENV, "redis://127.0.0.1:6379/0")


def cli(name: str) -> str:
    """Path of a peer's console script: next to this interpreter, else on PATH."""
    local = Path(sys.executable).parent / name
    if local.exists():
        return str(local)
    found = shutil.which(name)
    if found is None:
        raise FileNotFoundError(f"{name} not found; install the bench extra")
    return found


def fresh_ids(like: str, n: int) -> Iterator[str]:
    """``n`` distinct ids shaped like ``like``: a 36-character UUID or 32 hex digits."""
    for i in range(n):
        digits = f"{i:032x}"
        if len(like) == 36:
            yield f"{digits[:8]}-{digits[8:12]}-{digits[12:16]}-{digits[16:20]}-{digits[20:]}"
        elif len(like) == 32:
            yield digits
        else:
            raise ValueError(f"unexpected id shape {like!r}")


def copies(template: str, old_id: str, n: int) -> Iterator[tuple[str, str]]:
    """(id, template with ``old_id`` replaced by that id) for ``n`` fresh ids."""
    for new_id in fresh_ids(old_id, n):
        yield new_id, template.replace(old_id, new_id)


def chunks(items: Sequence[str], size: int) -> Iterator[Sequence[str]]:
    for start in range(0, len(items), size):
        yield items[start : start + size]
