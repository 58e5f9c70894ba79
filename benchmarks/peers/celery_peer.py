"""Celery: Redis broker, JSON serializer, no result backend.

noop: solo pool (tasks run in the worker's main thread; no pool hand-off) with a deep
prefetch. io: threads pool of IO_CONCURRENCY per process (gevent is not installed).
Delayed tasks (``countdown=``) are delivered to a worker at once, which holds them in its
timer until their eta.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from itertools import islice
from typing import Any

import celery

from benchmarks.common import mark_done, mark_late
from benchmarks.peers import (
    IO_CONCURRENCY,
    IO_SLEEP,
    QUEUE,
    Peer,
    Workload,
    cli,
    fresh_ids,
    redis_url_from_env,
)

TASK_NAMES: dict[Workload, str] = {"noop": "bench.noop", "io": "bench.io", "late": "bench.late"}
PREFETCH_MULTIPLIER: dict[Workload, int] = {"noop": 4, "io": 2, "late": 4}


def noop(url: str | None = None) -> None:
    mark_done()


def late(due: float) -> None:
    mark_late(due)


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
    app.task(name=TASK_NAMES["late"])(late)
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


class Client:
    def __init__(self, redis_url: str) -> None:
        self.app = make_app(redis_url)
        self.noop = self.app.signature(TASK_NAMES["noop"])
        self.late = self.app.signature(TASK_NAMES["late"])

    def send_each(self, urls: Sequence[str]) -> None:
        for url in urls:
            self.send(url)

    def send(self, url: str) -> None:
        self.noop.apply_async(args=(url,))

    def send_many(self, urls: Sequence[str]) -> None:
        with self.app.producer_or_acquire() as producer:
            for url in urls:
                self.noop.apply_async(args=(url,), producer=producer)

    def send_late(self, due: float, delay: float) -> None:
        self.late.apply_async(args=(due,), countdown=delay)

    def fill(self, n: int) -> None:
        self.send("http://fill.bench/")
        with self.app.connection_for_write() as conn:
            client = conn.default_channel.client
            template = client.lindex(QUEUE, 0).decode()
            message = json.loads(template)
            task_id = message["headers"]["id"]
            tag = message["properties"]["delivery_tag"]
            client.delete(QUEUE)
            ids = zip(fresh_ids(task_id, n), fresh_ids(tag, n), strict=True)
            while batch := list(islice(ids, 10_000)):
                data = [template.replace(task_id, a).replace(tag, b) for a, b in batch]
                client.lpush(QUEUE, *data)

    def dequeue(self, count: int) -> None:
        with self.app.connection_for_read() as conn:
            queue = self.app.amqp.queues[QUEUE](conn.default_channel)
            for _ in range(count):
                message = queue.get(no_ack=False, accept=["json"])
                if message is None:
                    raise RuntimeError("celery: queue ran empty")
                message.ack()

    def close(self) -> None:
        self.app.close()


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


NOTES = {
    "schedule-single": "signature.apply_async(args), a producer from the pool each call",
    "schedule-bulk": "apply_async in a loop on one producer (no bulk API)",
    "lateness": "apply_async(countdown=2); the solo worker holds ETA tasks in its timer",
    "dequeue": "kombu Queue.get(no_ack=False) (RPOP + unacked bookkeeping) + ack, "
    "one message a call",
}

PEER = Peer("celery", celery.__version__, enqueue, worker_commands, config, Client, NOTES)
