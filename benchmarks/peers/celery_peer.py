"""Celery: Redis broker, JSON serializer, no result backend.

noop: solo pool (tasks run in the worker's main thread; no pool hand-off) with a deep
prefetch. io: threads pool of IO_CONCURRENCY per process (gevent is not installed).
"""

from __future__ import annotations

import time
from typing import Any

import celery

from benchmarks.common import mark_done
from benchmarks.peers import (
    IO_CONCURRENCY,
    IO_SLEEP,
    QUEUE,
    Peer,
    Workload,
    cli,
    redis_url_from_env,
)

TASK_NAMES: dict[Workload, str] = {"noop": "bench.noop", "io": "bench.io"}
PREFETCH_MULTIPLIER: dict[Workload, int] = {"noop": 4, "io": 2}


def noop() -> None:
    mark_done()


def io() -> None:
    time.sleep(IO_SLEEP)
    mark_done()


def make_app(redis_url: str) -> Any:
    app = celery.Celery("bench", broker=redis_url, set_as_current=False)
    app.conf.update(
        task_serializer="json",
        accept_content=["json"],
        task_ignore_result=True,
        result_backend=None,
        task_default_queue=QUEUE,
        broker_connection_retry_on_startup=True,
        worker_hijack_root_logger=True,
    )
    app.task(name=TASK_NAMES["noop"])(noop)
    app.task(name=TASK_NAMES["io"])(io)
    return app


#: The app the worker CLI loads (``-A benchmarks.peers.celery_peer:app``).
app = make_app(redis_url_from_env())


def enqueue(redis_url: str, workload: Workload, n: int) -> None:
    sender = make_app(redis_url)
    sig = sender.signature(TASK_NAMES[workload])
    # One producer (one connection) for the whole batch: Celery's fast path for bulk sends.
    with sender.producer_or_acquire() as producer:
        for _ in range(n):
            sig.apply_async(producer=producer)


def _pool_args(workload: Workload) -> list[str]:
    if workload == "io":
        return ["--pool", "threads", "--concurrency", str(IO_CONCURRENCY)]
    return ["--pool", "solo"]


def worker_commands(redis_url: str, workload: Workload, processes: int) -> list[list[str]]:
    base = [cli("celery"), "-A", f"{__name__}:app", "--broker", redis_url, "worker"]
    opts = ["-Q", QUEUE, "--loglevel", "WARNING", "--prefetch-multiplier"]
    opts += [str(PREFETCH_MULTIPLIER[workload]), *_pool_args(workload)]
    opts += ["--without-gossip", "--without-mingle", "--without-heartbeat"]
    return [[*base, *opts, "--hostname", f"bench{i}@%h"] for i in range(processes)]


def config(workload: Workload, processes: int) -> dict[str, object]:
    pool = f"threads x{IO_CONCURRENCY}" if workload == "io" else "solo"
    return {
        "worker": f"{processes} x `celery worker --pool {pool.split()[0]}`",
        "pool": pool,
        "prefetch_multiplier": PREFETCH_MULTIPLIER[workload],
        "serializer": "json",
        "results": "ignored (no backend)",
        "flags": "--without-gossip --without-mingle --without-heartbeat, loglevel WARNING",
        "enqueue": "apply_async in a loop on one producer",
    }


PEER = Peer("celery", celery.__version__, enqueue, worker_commands, config)
