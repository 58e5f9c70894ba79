"""Huey: RedisHuey (blocking BRPOP), results off, a JSON message serializer.

One ``huey_consumer`` per "process", with thread workers: NOOP_WORKERS for noop and late,
IO_CONCURRENCY for io (greenlet workers need gevent, which is not installed). Delayed
tasks (``schedule(delay=)``) wait in Huey's schedule sorted set; the consumer's scheduler
moves due ones to the queue every ``--scheduler-interval`` seconds (1, its minimum).
"""

from __future__ import annotations

import datetime
import json
import time
from collections.abc import Sequence
from itertools import islice
from typing import Any

import huey
from huey.registry import Message
from huey.serializer import Serializer

from benchmarks.common import mark_done, mark_late
from benchmarks.peers import (
    IO_CONCURRENCY,
    IO_SLEEP,
    QUEUE,
    Peer,
    Workload,
    chunks,
    cli,
    copies,
    redis_url_from_env,
)

NOOP_WORKERS = 4


class JSONSerializer(Serializer):  # type: ignore[misc]  # Serializer is Any to mypy
    """Huey's default serializer is pickle; this one handles task messages as JSON.

    Enough for these tasks: the eta (a naive UTC datetime) goes as an ISO string; expiry,
    pipelines or chords are not handled (JSON raises on those).
    """

    ETA = Message._fields.index("eta")

    def _serialize(self, data: Any) -> bytes:
        if not isinstance(data, Message):
            raise TypeError(f"JSONSerializer only handles task messages, not {type(data)}")
        fields = list(data)
        if isinstance(fields[self.ETA], datetime.datetime):
            fields[self.ETA] = fields[self.ETA].isoformat()
        return json.dumps(fields, separators=(",", ":")).encode()

    def _deserialize(self, data: bytes) -> Any:
        fields = json.loads(data)
        if isinstance(fields[self.ETA], str):
            fields[self.ETA] = datetime.datetime.fromisoformat(fields[self.ETA])
        return Message(*fields)


def make_huey(redis_url: str) -> Any:
    return huey.RedisHuey(QUEUE, url=redis_url, results=False, serializer=JSONSerializer())


#: The instance the consumer loads (``huey_consumer benchmarks.peers.huey_peer.app``).
app = make_huey(redis_url_from_env())


def noop(url: str | None = None) -> None:
    mark_done()


def io() -> None:
    time.sleep(IO_SLEEP)
    mark_done()


def late(due: float) -> None:
    mark_late(due)


def _tasks(instance: Any) -> dict[Workload, Any]:
    return {"noop": instance.task()(noop), "io": instance.task()(io), "late": instance.task()(late)}


TASKS = _tasks(app)


def enqueue(redis_url: str, workload: Workload, n: int) -> None:
    sender = make_huey(redis_url)
    # map() is Huey's bulk call; it still does one LPUSH per task (no pipelining).
    _tasks(sender)[workload].map([()] * n)
    sender.storage.pool.disconnect()


class Client:
    def __init__(self, redis_url: str) -> None:
        self.huey = make_huey(redis_url)
        self.tasks = _tasks(self.huey)

    def send_each(self, urls: Sequence[str]) -> None:
        for url in urls:
            self.send(url)

    def send(self, url: str) -> None:
        self.tasks["noop"](url)

    def send_many(self, urls: Sequence[str]) -> None:
        for chunk in chunks(urls, 1000):
            self.tasks["noop"].map([(url,) for url in chunk])

    def send_late(self, due: float, delay: float) -> None:
        self.tasks["late"].schedule(args=(due,), delay=delay)

    def fill(self, n: int) -> None:
        self.send("http://fill.bench/")
        storage = self.huey.storage
        raw = storage.conn.lindex(storage.queue_key, 0)
        template = raw.decode()
        old_id = json.loads(template)[0]
        storage.conn.delete(storage.queue_key)
        made = copies(template, old_id, n)
        while batch := list(islice(made, 10_000)):
            storage.conn.lpush(storage.queue_key, *(data for _, data in batch))

    def dequeue(self, count: int) -> None:
        for _ in range(count):
            if self.huey.dequeue() is None:
                raise RuntimeError("huey: queue ran empty")

    def close(self) -> None:
        self.huey.storage.pool.disconnect()


def _workers(workload: Workload) -> int:
    return IO_CONCURRENCY if workload == "io" else NOOP_WORKERS


def worker_commands(redis_url: str, workload: Workload, processes: int) -> list[list[str]]:
    cmd = [cli("huey_consumer"), f"{__name__}.app", "--worker-type", "thread"]
    return [[*cmd, "--workers", str(_workers(workload)), "--quiet"]] * processes


def config(workload: Workload, processes: int) -> dict[str, object]:
    workers = _workers(workload)
    return {
        "worker": f"{processes} x `huey_consumer --worker-type thread --workers {workers}`",
        "threads_per_process": workers,
        "storage": "RedisHuey, blocking BRPOP",
        "serializer": "json (custom Serializer for task messages)",
        "results": "off (results=False)",
        "enqueue": "TaskWrapper.map (one LPUSH per task)",
    }


NOTES = {
    "schedule-single": "task(url), one LPUSH each",
    "schedule-bulk": "TaskWrapper.map, 1,000 a call (still one LPUSH per task)",
    "lateness": "task.schedule(args, delay=2); consumer's scheduler checks every 1 s "
    "(--scheduler-interval minimum)",
    "dequeue": "huey.dequeue() (RPOP + deserialize), one task a call",
}

PEER = Peer("huey", huey.__version__, enqueue, worker_commands, config, Client, NOTES)
