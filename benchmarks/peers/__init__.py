"""Peer task queues benchmarked against crawlq: Celery, RQ, Dramatiq, arq and Huey.

Each ``<name>_peer`` module defines the two task kinds (``noop``: just mark_done;
``io``: sleep 50 ms then mark_done), and exposes a module-level ``PEER``: how to
enqueue tasks in bulk and which worker processes to start, with the configuration
chosen for each workload. Worker processes learn the Redis URL and the marker file
from the environment (URL_ENV, common.MARKER_ENV).
"""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

Workload = Literal["noop", "io"]
WORKLOADS: tuple[Workload, ...] = ("noop", "io")
NAMES = ("celery", "rq", "dramatiq", "arq", "huey")

#: How long an ``io`` task sleeps.
IO_SLEEP = 0.05
#: Concurrency per process for the ``io`` workload (crawlq runs ~200-500 slots).
IO_CONCURRENCY = 200
#: Worker processes read the Redis URL from here.
URL_ENV = "BENCH_REDIS_URL"
QUEUE = "bench"


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
