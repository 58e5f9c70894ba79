"""arq: asyncio worker, JSON job serializer, results not kept (keep_result=0).

One ``arq`` worker process per "process". io tasks ``await asyncio.sleep``; max_jobs
is the concurrency per process. poll_delay is lowered from 0.5 s: arq sleeps that long
after each batch it reads, which caps short tasks at ~200/s per worker with the
defaults (max_jobs=10, poll_delay=0.5); max_jobs 10, 100 or 500 made no clear difference.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import arq
from arq.connections import RedisSettings

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


async def noop(ctx: dict[str, Any]) -> None:
    mark_done()


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
SETTINGS: dict[Workload, str] = {"noop": "NOOP_SETTINGS", "io": "IO_SETTINGS"}


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


PEER = Peer("arq", arq.VERSION, enqueue, worker_commands, config)
