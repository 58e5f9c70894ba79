"""arq: asyncio worker, JSON job serializer, results not kept (keep_result=0).

One ``arq`` worker process per "process". io tasks ``await asyncio.sleep``; max_jobs
is the concurrency per process. poll_delay is lowered from 0.5 s: arq sleeps that long
after each batch it reads, which caps short tasks at ~200/s per worker with the
defaults (max_jobs=10, poll_delay=0.5); max_jobs 10, 100 or 500 made no clear difference.
Deferred jobs (``_defer_by``) sit in the queue's sorted set scored by their time; the
worker's poll (every POLL_DELAY) picks them up once due.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Sequence
from itertools import islice
from typing import Any

import arq
from arq.connections import RedisSettings
from arq.constants import job_key_prefix
from arq.jobs import serialize_job
from arq.worker import Worker

from benchmarks.common import mark_done, mark_late
from benchmarks.peers import (
    IO_CONCURRENCY,
    IO_SLEEP,
    QUEUE,
    Peer,
    Workload,
    chunks,
    cli,
    fresh_ids,
    redis_url_from_env,
)

NOOP_MAX_JOBS = 10
POLL_DELAY = 0.01
ENQUEUE_CONCURRENCY = 200

#: For ``arq --custom-log-dict``: arq's default logs every job at INFO.
LOG_CONFIG: dict[str, Any] = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"stderr": {"class": "logging.StreamHandler", "level": "WARNING"}},
    "loggers": {"arq": {"handlers": ["stderr"], "level": "WARNING"}},
}


def dumps(obj: Any) -> bytes:
    return json.dumps(obj, separators=(",", ":")).encode()


def loads(data: bytes) -> Any:
    return json.loads(data)


async def noop(ctx: dict[str, Any], url: str | None = None) -> None:
    mark_done()


async def late(ctx: dict[str, Any], due: float) -> None:
    mark_late(due)


async def io(ctx: dict[str, Any]) -> None:
    await asyncio.sleep(IO_SLEEP)
    mark_done()


def _settings(function: Any, max_jobs: int) -> dict[str, Any]:
    return {
        "functions": [function],
        "queue_name": QUEUE,
        "redis_settings": RedisSettings.from_dsn(redis_url_from_env()),
        "max_jobs": max_jobs,
        "poll_delay": POLL_DELAY,
        "keep_result": 0,
        "job_serializer": dumps,
        "job_deserializer": loads,
    }


#: The worker CLI loads these: ``arq benchmarks.peers.arq_peer.NOOP_SETTINGS``.
NOOP_SETTINGS = _settings(noop, NOOP_MAX_JOBS)
IO_SETTINGS = _settings(io, IO_CONCURRENCY)
LATE_SETTINGS = _settings(late, NOOP_MAX_JOBS)
SETTINGS: dict[Workload, str] = {
    "noop": "NOOP_SETTINGS",
    "io": "IO_SETTINGS",
    "late": "LATE_SETTINGS",
}


async def _enqueue(redis_url: str, workload: Workload, n: int) -> None:
    pool = await arq.create_pool(
        RedisSettings.from_dsn(redis_url),
        job_serializer=dumps,
        job_deserializer=loads,
        default_queue_name=QUEUE,
    )
    try:
        # No bulk API: each enqueue_job is its own WATCH/MULTI transaction, so run many
        # of them concurrently.
        for start in range(0, n, ENQUEUE_CONCURRENCY):
            count = min(ENQUEUE_CONCURRENCY, n - start)
            await asyncio.gather(*(pool.enqueue_job(workload) for _ in range(count)))
    finally:
        await pool.aclose()


def enqueue(redis_url: str, workload: Workload, n: int) -> None:
    asyncio.run(_enqueue(redis_url, workload, n))


class Client:
    """arq is asyncio only: each call runs on this client's own event loop."""

    def __init__(self, redis_url: str) -> None:
        self.settings = RedisSettings.from_dsn(redis_url)
        self.runner = asyncio.Runner()
        self.pool = self.runner.run(
            arq.create_pool(
                self.settings,
                job_serializer=dumps,
                job_deserializer=loads,
                default_queue_name=QUEUE,
            )
        )

    def send_each(self, urls: Sequence[str]) -> None:
        async def send() -> None:
            for url in urls:
                await self.pool.enqueue_job("noop", url)

        self.runner.run(send())

    def send_many(self, urls: Sequence[str]) -> None:
        async def send() -> None:
            for chunk in chunks(urls, ENQUEUE_CONCURRENCY):
                await asyncio.gather(*(self.pool.enqueue_job("noop", url) for url in chunk))

        self.runner.run(send())

    def send_late(self, due: float, delay: float) -> None:
        self.runner.run(self.pool.enqueue_job("late", due, _defer_by=delay))

    def fill(self, n: int) -> None:
        async def fill() -> None:
            now_ms = round(time.time() * 1000)
            data = serialize_job(
                "noop", ("http://fill.bench/",), {}, None, now_ms, serializer=dumps
            )
            ids = fresh_ids("0" * 32, n)
            while batch := list(islice(ids, 10_000)):
                pipe = self.pool.pipeline(transaction=False)
                for job_id in batch:
                    pipe.set(job_key_prefix + job_id, data)
                pipe.zadd(QUEUE, dict.fromkeys(batch, now_ms))
                await pipe.execute()

        self.runner.run(fill())

    def dequeue(self, count: int) -> None:
        # arq has no dequeue call apart from its worker: a burst worker that stops after
        # `count` jobs (its poll, in-progress key, job read, run of noop, finish).
        worker = Worker(
            functions=[noop],
            queue_name=QUEUE,
            redis_pool=self.pool,
            burst=True,
            max_burst_jobs=count,
            max_jobs=NOOP_MAX_JOBS,
            poll_delay=0,
            keep_result=0,
            handle_signals=False,
            job_serializer=dumps,
            job_deserializer=loads,
        )
        self.runner.run(worker.main())

    def close(self) -> None:
        self.runner.run(self.pool.aclose())
        self.runner.close()


def worker_commands(redis_url: str, workload: Workload, processes: int) -> list[list[str]]:
    settings = f"{__name__}.{SETTINGS[workload]}"
    return [[cli("arq"), settings, "--custom-log-dict", f"{__name__}.LOG_CONFIG"]] * processes


def config(workload: Workload, processes: int) -> dict[str, object]:
    max_jobs = IO_CONCURRENCY if workload == "io" else NOOP_MAX_JOBS
    return {
        "worker": f"{processes} x `arq` worker (asyncio)",
        "max_jobs": max_jobs,
        "poll_delay": f"{POLL_DELAY} (default 0.5 caps noop at ~200/s per worker)",
        "serializer": "json",
        "results": "keep_result=0 (not kept)",
        "enqueue": f"enqueue_job, {ENQUEUE_CONCURRENCY} concurrent (no bulk API)",
    }


NOTES = {
    "schedule-single": "await enqueue_job(name, url), one at a time",
    "schedule-bulk": f"enqueue_job, {ENQUEUE_CONCURRENCY} concurrent (no bulk API)",
    "lateness": f"enqueue_job(_defer_by=2); the worker polls every {POLL_DELAY} s",
    "dequeue": "no dequeue call apart from the worker: a burst Worker (max_jobs "
    f"{NOOP_MAX_JOBS}) stopping after the count, running noop jobs",
}

PEER = Peer("arq", arq.VERSION, enqueue, worker_commands, config, Client, NOTES)
