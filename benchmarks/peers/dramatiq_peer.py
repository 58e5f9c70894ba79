"""Dramatiq: Redis broker (its default JSON encoder), default middleware.

One ``dramatiq`` command with ``--processes P`` (a supervisor forks P worker processes).
noop: NOOP_THREADS threads per process. io: IO_CONCURRENCY threads per process and
time.sleep (Dramatiq's async actors still hold a worker thread each while they wait).
"""

from __future__ import annotations

import time

import dramatiq
from dramatiq.brokers.redis import RedisBroker

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

NOOP_THREADS = 8


def make_broker(redis_url: str) -> RedisBroker:
    return RedisBroker(url=redis_url)  # type: ignore[no-untyped-call]


#: The broker the worker CLI loads (``dramatiq benchmarks.peers.dramatiq_peer``).
broker = make_broker(redis_url_from_env())
dramatiq.set_broker(broker)


@dramatiq.actor(queue_name=QUEUE, actor_name="noop")
def noop() -> None:
    mark_done()


@dramatiq.actor(queue_name=QUEUE, actor_name="io")
def io() -> None:
    time.sleep(IO_SLEEP)
    mark_done()


ACTORS = {"noop": noop, "io": io}


def _threads(workload: Workload) -> int:
    return IO_CONCURRENCY if workload == "io" else NOOP_THREADS


def enqueue(redis_url: str, workload: Workload, n: int) -> None:
    sender = make_broker(redis_url)
    message = ACTORS[workload].message()
    try:
        # No bulk API (group().run() also enqueues one by one): one Lua call per message.
        for _ in range(n):
            sender.enqueue(message)
    finally:
        sender.close()


def worker_commands(redis_url: str, workload: Workload, processes: int) -> list[list[str]]:
    cmd = [cli("dramatiq"), __name__, "--processes", str(processes)]
    return [[*cmd, "--threads", str(_threads(workload)), "--queues", QUEUE]]


def config(workload: Workload, processes: int) -> dict[str, object]:
    threads = _threads(workload)
    return {
        "worker": f"`dramatiq --processes {processes} --threads {threads}` (+1 supervisor)",
        "threads_per_process": threads,
        "prefetch": f"{threads * 2} per process (Dramatiq default: 2 x threads)",
        "serializer": "json (default encoder)",
        "results": "none (no Results middleware)",
        "enqueue": "RedisBroker.enqueue in a loop (no bulk API)",
    }


PEER = Peer("dramatiq", dramatiq.__version__, enqueue, worker_commands, config)
