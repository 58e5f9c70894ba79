"""RQ: JSON serializer, SimpleWorker, default job options.

RQ's default Worker forks a work horse per job; SimpleWorker runs jobs in the worker
process itself, which is much faster for short jobs. RQ has no in-process concurrency
(no thread or async pool), so for the io workload each "process" is an
``rq worker-pool`` of IO_WORKERS forked SimpleWorkers: RQ's documented way to run
many jobs at once, paid for in processes and memory. Delayed jobs (``enqueue_in``) wait
in RQ's scheduled registry until a worker started ``--with-scheduler`` moves them,
checking every second (RQ's default scheduler interval).
"""

from __future__ import annotations

import datetime
import time
from collections.abc import Sequence
from itertools import islice
from typing import Any

import redis
import rq
from rq.serializers import JSONSerializer

from benchmarks.common import mark_done, mark_late
from benchmarks.peers import IO_SLEEP, QUEUE, Peer, Workload, chunks, cli, fresh_ids

#: Forked SimpleWorkers per "process" for the io workload. RQ spends ~2-3 ms of CPU per
#: job, so on 2 cores more workers only add contention (1 process: 10 -> ~180/s,
#: 25 -> ~330/s, 50 -> ~265/s).
IO_WORKERS = 25
WORKER_CLASS = "rq.worker.SimpleWorker"
BATCH = 1000


def noop(url: str | None = None) -> None:
    mark_done()


def io() -> None:
    time.sleep(IO_SLEEP)
    mark_done()


def late(due: float) -> None:
    mark_late(due)


def enqueue(redis_url: str, workload: Workload, n: int) -> None:
    func = noop if workload == "noop" else io
    conn = redis.Redis.from_url(redis_url)
    try:
        queue = rq.Queue(QUEUE, connection=conn, serializer=JSONSerializer)
        jobs = (rq.Queue.prepare_data(func) for _ in range(n))
        while batch := list(islice(jobs, BATCH)):
            queue.enqueue_many(batch)  # one pipeline per batch
    finally:
        conn.close()


class Client:
    def __init__(self, redis_url: str) -> None:
        self.conn = redis.Redis.from_url(redis_url)
        self.queue = rq.Queue(QUEUE, connection=self.conn, serializer=JSONSerializer)

    def send_each(self, urls: Sequence[str]) -> None:
        for url in urls:
            self.send(url)

    def send(self, url: str) -> None:
        self.queue.enqueue(noop, url)

    def send_many(self, urls: Sequence[str]) -> None:
        for chunk in chunks(urls, BATCH):
            self.queue.enqueue_many([rq.Queue.prepare_data(noop, args=(url,)) for url in chunk])

    def send_late(self, due: float, delay: float) -> None:
        self.queue.enqueue_in(datetime.timedelta(seconds=delay), late, due)

    def fill(self, n: int) -> None:
        job = self.queue.enqueue(noop, "http://fill.bench/")
        fields: Any = self.conn.hgetall(job.key)
        self.conn.delete(self.queue.key)
        ids = fresh_ids(job.id, n)
        while batch := list(islice(ids, 10_000)):
            pipe = self.conn.pipeline(transaction=False)
            for job_id in batch:
                pipe.hset(f"rq:job:{job_id}", mapping=fields)
            pipe.rpush(self.queue.key, *batch)
            pipe.execute()

    def dequeue(self, count: int) -> None:
        for _ in range(count):
            got = rq.Queue.dequeue_any(
                [self.queue], None, connection=self.conn, serializer=JSONSerializer
            )
            if got is None:
                raise RuntimeError("rq: queue ran empty")

    def close(self) -> None:
        self.conn.close()


def worker_commands(redis_url: str, workload: Workload, processes: int) -> list[list[str]]:
    common = ["--url", redis_url, "--serializer", "json", "--worker-class", WORKER_CLASS]
    if workload == "late":
        cmd = [cli("rq"), "worker", *common, "--with-scheduler", "--quiet", QUEUE]
    elif workload == "noop":
        cmd = [cli("rq"), "worker", *common, "--quiet", QUEUE]
    else:
        cmd = [cli("rq"), "worker-pool", *common, "--quiet", "--num-workers", str(IO_WORKERS)]
        cmd.append(QUEUE)
    return [cmd] * processes


def config(workload: Workload, processes: int) -> dict[str, object]:
    if workload == "late":
        worker = f"{processes} x `rq worker --worker-class SimpleWorker --with-scheduler`"
    elif workload == "noop":
        worker = f"{processes} x `rq worker --worker-class SimpleWorker`"
    else:
        worker = f"{processes} x `rq worker-pool --num-workers {IO_WORKERS}` of SimpleWorker"
        worker += f" ({processes * IO_WORKERS} forked worker processes: RQ has no in-process pool)"
    return {
        "worker": worker,
        "concurrency_per_process": IO_WORKERS if workload == "io" else 1,
        "serializer": "json",
        "results": "kept 500 s (default; result_ttl=0 measured ~10% slower: extra deletes)",
        "enqueue": f"Queue.enqueue_many, {BATCH} jobs per pipeline",
    }


NOTES = {
    "schedule-single": "Queue.enqueue(noop, url)",
    "schedule-bulk": f"Queue.enqueue_many, {BATCH} jobs per pipeline",
    "lateness": "Queue.enqueue_in(timedelta(seconds=2)); `rq worker --with-scheduler` "
    "(scheduler polls every 1 s, RQ's default)",
    "dequeue": "Queue.dequeue_any([queue], None) (LMOVE + job HGETALL), one job a call",
}

PEER = Peer("rq", rq.__version__, enqueue, worker_commands, config, Client, NOTES)
