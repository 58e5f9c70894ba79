"""Dramatiq: Redis broker (its default JSON encoder), default middleware.

One ``dramatiq`` command with ``--processes P`` (a supervisor forks P worker processes).
noop: NOOP_THREADS threads per process. io: IO_CONCURRENCY threads per process and
time.sleep (Dramatiq's async actors still hold a worker thread each while they wait).
Delayed messages (``send_with_options(delay=)``) go to the delay queue; the worker fetches
them at once and holds each until its eta.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from itertools import islice
from typing import Any

import dramatiq
from dramatiq.brokers.redis import RedisBroker

from benchmarks.common import mark_done, mark_late
from benchmarks.peers import (
    IO_CONCURRENCY,
    IO_SLEEP,
    QUEUE,
    Peer,
    Workload,
    cli,
    copies,
    redis_url_from_env,
)

NOOP_THREADS = 8


def make_broker(redis_url: str) -> RedisBroker:
    return RedisBroker(url=redis_url)  # type: ignore[no-untyped-call]


#: The broker the worker CLI loads (``dramatiq benchmarks.peers.dramatiq_peer``).
broker = make_broker(redis_url_from_env())
dramatiq.set_broker(broker)


@dramatiq.actor(queue_name=QUEUE, actor_name="noop")
def noop(url: str | None = None) -> None:
    mark_done()


@dramatiq.actor(queue_name=QUEUE, actor_name="io")
def io() -> None:
    time.sleep(IO_SLEEP)
    mark_done()


@dramatiq.actor(queue_name=QUEUE, actor_name="late")
def late(due: float) -> None:
    mark_late(due)


ACTORS: dict[str, Any] = {"noop": noop, "io": io, "late": late}


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


class Client:
    def __init__(self, redis_url: str) -> None:
        self.broker = make_broker(redis_url)

    def send_each(self, urls: Sequence[str]) -> None:
        for url in urls:
            self.send(url)

    def send(self, url: str) -> None:
        self.broker.enqueue(ACTORS["noop"].message(url))

    def send_many(self, urls: Sequence[str]) -> None:
        for url in urls:  # no bulk API
            self.broker.enqueue(ACTORS["noop"].message(url))

    def send_late(self, due: float, delay: float) -> None:
        self.broker.enqueue(ACTORS["late"].message(due), delay=round(delay * 1000))

    def fill(self, n: int) -> None:
        message = self.broker.enqueue(ACTORS["noop"].message("http://fill.bench/"))
        old_id = message.options["redis_message_id"]
        queue_key = f"{self.broker.namespace}:{QUEUE}"
        messages_key = f"{queue_key}.msgs"
        raw: Any = self.broker.client.hget(messages_key, old_id)
        template = raw.decode()
        self.broker.client.delete(queue_key, messages_key)
        made = copies(template, old_id, n)
        while batch := list(islice(made, 10_000)):
            pipe = self.broker.client.pipeline(transaction=False)
            pipe.hset(messages_key, mapping=dict(batch))
            pipe.rpush(queue_key, *(message_id for message_id, _ in batch))
            pipe.execute()

    def dequeue(self, count: int) -> None:
        consumer = self.broker.consume(QUEUE, prefetch=1, timeout=1000)
        try:
            for _ in range(count):
                message = next(consumer)
                if message is None:
                    raise RuntimeError("dramatiq: queue ran empty")
                consumer.ack(message)
        finally:
            consumer.close()

    def close(self) -> None:
        self.broker.close()


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


NOTES = {
    "schedule-single": "RedisBroker.enqueue(actor.message(url)), one Lua call each",
    "schedule-bulk": "RedisBroker.enqueue in a loop (no bulk API)",
    "lateness": "RedisBroker.enqueue(message, delay=2000 ms); the worker fetches delayed "
    "messages at once and holds each until its eta",
    "dequeue": "broker.consume(prefetch=1): next() (Lua fetch) + ack, one message a call",
}

PEER = Peer("dramatiq", dramatiq.__version__, enqueue, worker_commands, config, Client, NOTES)
