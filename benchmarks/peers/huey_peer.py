"""Huey: RedisHuey (blocking BRPOP), results off, a JSON message serializer.

One ``huey_consumer`` per "process", with thread workers: NOOP_WORKERS for noop,
IO_CONCURRENCY for io (greenlet workers need gevent, which is not installed).
"""

from __future__ import annotations

import json
import time
from typing import Any

import huey
from huey.registry import Message
from huey.serializer import Serializer

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

NOOP_WORKERS = 4


class JSONSerializer(Serializer):  # type: ignore[misc]  # Serializer is Any to mypy
    """Huey's default serializer is pickle; this one handles task messages as JSON.

    Enough for these tasks (no eta, expiry, pipelines or chords: JSON raises on those).
    """

    def _serialize(self, data: Any) -> bytes:
        if not isinstance(data, Message):
            raise TypeError(f"JSONSerializer only handles task messages, not {type(data)}")
        return json.dumps(list(data), separators=(",", ":")).encode()

    def _deserialize(self, data: bytes) -> Any:
        return Message(*json.loads(data))


def make_huey(redis_url: str) -> Any:
    return huey.RedisHuey(QUEUE, url=redis_url, results=False, serializer=JSONSerializer())


#: The instance the consumer loads (``huey_consumer benchmarks.peers.huey_peer.app``).
app = make_huey(redis_url_from_env())


def noop() -> None:
    mark_done()


def io() -> None:
    time.sleep(IO_SLEEP)
    mark_done()


def _tasks(instance: Any) -> dict[Workload, Any]:
    return {"noop": instance.task()(noop), "io": instance.task()(io)}


TASKS = _tasks(app)


def enqueue(redis_url: str, workload: Workload, n: int) -> None:
    sender = make_huey(redis_url)
    # map() is Huey's bulk call; it still does one LPUSH per task (no pipelining).
    _tasks(sender)[workload].map([()] * n)
    sender.storage.pool.disconnect()


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


PEER = Peer("huey", huey.__version__, enqueue, worker_commands, config)
