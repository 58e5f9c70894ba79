"""RQ: JSON serializer, SimpleWorker, default job options.

RQ's default Worker forks a work horse per job; SimpleWorker runs jobs in the worker
process itself, which is much faster for short jobs. RQ has no in-process concurrency
(no thread or async pool), so for the io workload each "process" is an
``rq worker-pool`` of IO_WORKERS forked SimpleWorkers: RQ's documented way to run
many jobs at once, paid for in processes and memory.
"""

from __future__ import annotations

import time
from itertools import islice

import redis
import rq
from rq.serializers import JSONSerializer

from benchmarks.common import mark_done
from benchmarks.peers import IO_SLEEP, QUEUE, Peer, Workload, cli

#: Forked SimpleWorkers per "process" for the io workload. RQ spends ~2-3 ms of CPU per
#: job, so on 2 cores more workers only add contention (1 process: 10 -> ~180/s,
#: 25 -> ~330/s, 50 -> ~265/s).
IO_WORKERS = 25
WORKER_CLASS = "rq.worker.SimpleWorker"
BATCH = 1000


def noop() -> None:
    mark_done()


def io() -> None:
    time.sleep(IO_SLEEP)
    mark_done()


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


def worker_commands(redis_url: str, workload: Workload, processes: int) -> list[list[str]]:
    common = ["--url", redis_url, "--serializer", "json", "--worker-class", WORKER_CLASS]
    if workload == "noop":
        cmd = [cli("rq"), "worker", *common, "--quiet", QUEUE]
    else:
        cmd = [cli("rq"), "worker-pool", *common, "--quiet", "--num-workers", str(IO_WORKERS)]
        cmd.append(QUEUE)
    return [cmd] * processes


def config(workload: Workload, processes: int) -> dict[str, object]:
    if workload == "noop":
        worker = f"{processes} x `rq worker --worker-class SimpleWorker`"
    else:
        worker = f"{processes} x `rq worker-pool --num-workers {IO_WORKERS}` of SimpleWorker"
        worker += f" ({processes * IO_WORKERS} forked worker processes: RQ has no in-process pool)"
    return {
        "worker": worker,
        "concurrency_per_process": 1 if workload == "noop" else IO_WORKERS,
        "serializer": "json",
        "results": "kept 500 s (default; result_ttl=0 measured ~10% slower: extra deletes)",
        "enqueue": f"Queue.enqueue_many, {BATCH} jobs per pipeline",
    }


PEER = Peer("rq", rq.__version__, enqueue, worker_commands, config)
