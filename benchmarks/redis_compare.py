"""crawlq on Redis against Celery, RQ, Dramatiq, arq and Huey, all on one redis-server.

    python -m benchmarks.redis_compare [--peer NAME ...] [--only MEASURE ...] [--big N]
        [--redis-url URL] [--json OUT]

Measures (issue 3), each system in turn, Redis flushed before each:

- schedule: SINGLES one-call enqueues, then MEMORY_ELEMENTS URLs by the fastest bulk path;
  the bulk run also gives the bytes per queued element (INFO memory used_memory once the
  client disconnected minus before, over MEMORY_ELEMENTS), with the same URL strings for
  everyone;
- drain: crawlq_bench.drain on Redis, peers.run.run_peer for the peers (no-op and I/O,
  1 and 2 worker processes);
- lateness: LATE_TASKS delayed tasks, scheduled one at a time at LATE_PACE a second, each
  due LATE_DELAY seconds after its own schedule call; the task records time.time() minus
  its due time as its first step (common.mark_late);
- claim: crawlq_bench.claim_rate on Redis (10,000 groups, 90% blocked; the two sizes'
  rounds taking turns), and for the peers CLAIMS dequeues by their own dequeue primitive,
  each at GROUPS and at ``--big`` queued.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from functools import partial
from pathlib import Path
from typing import Any

import redis

import crawlq
from benchmarks import crawlq_bench
from benchmarks.common import (
    LATENESS_ENV,
    MARKER_ENV,
    Workers,
    percentile,
    run_workers,
    wait_for_completions,
)
from benchmarks.crawlq_bench import CLAIMS, GROUPS, IO_TASKS, NOOP_TASKS, Target
from benchmarks.peers import NAMES, WORKLOADS, Peer
from crawlq.testing.redis_server import redis_server
from crawlq.types import JSON

REPO_ROOT = Path(__file__).resolve().parents[1]
SYSTEMS = ("crawlq", *NAMES)
MEASURES = ("schedule", "drain", "lateness", "claim")
SINGLES = 2_000
MEMORY_ELEMENTS = 100_000
BULK = 10_000
LATE_TASKS = 2_000
LATE_DELAY = 2.0
LATE_PACE = 1_000.0
HOSTS = 1_000


def url_of(n: int) -> str:
    """The n-th benchmark URL: about 60 characters, in HOSTS hosts."""
    return f"https://www.host{n % HOSTS:04d}.example.com/catalog/item-{n:08d}.html"


def flush(redis_url: str) -> None:
    client = redis.Redis.from_url(redis_url, socket_timeout=30)
    try:
        client.flushall()
    finally:
        client.close()


def used_memory(redis_url: str) -> int:
    client = redis.Redis.from_url(redis_url, socket_timeout=30)
    try:
        info: Any = client.info("memory")
        return int(info["used_memory"])
    finally:
        client.close()


def record(system: str, version: str, workload: str, **fields: Any) -> dict[str, Any]:
    return {
        "suite": "redis",
        "system": system,
        "version": version,
        "backend": "redis",
        "workload": workload,
        **fields,
    }


def load_peer(name: str) -> Peer:
    from benchmarks.peers.run import load_peer as load

    return load(name)


# -- the two kinds of system behind one face -----------------------------------------------


class CrawlqClient:
    """crawlq's side of peers.Client, on one namespace of the server, with the async API
    (as the SQLite benchmark uses it) on this client's own event loop."""

    def __init__(self, backend_url: str) -> None:
        self.runner = asyncio.Runner()
        self.app = crawlq_bench.bench_app(backend_url)
        self.pages = self.app.task(queue="pages")(_page)  # grouped by host, as crawls are
        self._late = 0
        # Connect and store the queues now, so that is not timed.
        self.runner.run(self.app.backend())

    def send_each(self, urls: Sequence[str]) -> None:
        async def send() -> None:
            for url in urls:
                await self.app.aschedule(self.pages, url)

        self.runner.run(send())

    def send_each_sync(self, urls: Sequence[str]) -> None:
        """As `send_each`, through the sync API (`app.schedule`) from this thread."""
        for url in urls:
            self.app.schedule(self.pages, url)

    def send_many(self, urls: Sequence[str]) -> None:
        async def send() -> None:
            for start in range(0, len(urls), BULK):
                await self.app.aschedule_many(self.pages, urls[start : start + BULK])

        self.runner.run(send())

    def send_late(self, due: float, delay: float) -> None:
        self._late += 1
        element: JSON = {"n": self._late, "due": due}
        self.runner.run(self.app.aschedule("late", element, seconds=delay))

    def close(self) -> None:
        self.runner.run(self.app.aclose())
        self.runner.close()
        self.app.close()  # the sync API's backend, if `send_each_sync` opened it


async def _page(ctx: crawlq.Context, url: str) -> None:
    """Never run: the schedule and memory measures only queue elements."""


def open_client(system: str, redis_url: str, namespace: str) -> tuple[Any, str]:
    """A connected client (crawlq or peer) and the system's version."""
    if system == "crawlq":
        return CrawlqClient(f"{redis_url}?namespace={namespace}"), crawlq.__version__
    peer = load_peer(system)
    assert peer.client is not None, f"{system} has no Client"
    return peer.client(redis_url), peer.version


def note(system: str, measure: str) -> str:
    if system == "crawlq":
        return {
            "schedule-single": "await app.aschedule(task, url), one element a call",
            "schedule-bulk": f"await app.aschedule_many(task, urls), {BULK:,} a call, "
            f"grouped by host ({HOSTS:,} hosts)",
            "lateness": "await app.aschedule(task, element, seconds=2); 1 x `crawlq worker -c 500`",
            "dequeue": "backend.claim(limit=1) in a loop, 9,000 of 10,000 groups blocked",
        }[measure]
    return load_peer(system).notes.get(measure, "")


# -- measures --------------------------------------------------------------------------------


def schedule_and_memory(system: str, redis_url: str) -> list[dict[str, Any]]:
    """Single enqueues; then bulk enqueues of MEMORY_ELEMENTS URLs, with used_memory around."""
    urls = [url_of(n) for n in range(MEMORY_ELEMENTS)]
    flush(redis_url)
    client, version = open_client(system, redis_url, "bench-single")
    try:
        singles = [url_of(MEMORY_ELEMENTS + n) for n in range(SINGLES)]
        started = time.perf_counter()
        client.send_each(singles)
        single_seconds = time.perf_counter() - started
    finally:
        client.close()
    flush(redis_url)
    client, version = open_client(system, redis_url, "bench-bulk")
    try:
        before = used_memory(redis_url)
        started = time.perf_counter()
        client.send_many(urls)
        bulk_seconds = time.perf_counter() - started
    finally:
        client.close()
    # Read once the client is gone: its connection's buffers (a bulk call's ~1.5 MB query
    # buffer, which Redis shrinks only later) are not where the elements are stored.
    after = used_memory(redis_url)
    return [
        record(
            system,
            version,
            "schedule-single",
            tasks=SINGLES,
            seconds=single_seconds,
            rate=SINGLES / single_seconds,
            config=note(system, "schedule-single"),
        ),
        record(
            system,
            version,
            "schedule-bulk",
            tasks=len(urls),
            seconds=bulk_seconds,
            rate=len(urls) / bulk_seconds,
            config=note(system, "schedule-bulk"),
        ),
        record(
            system,
            version,
            "memory",
            elements=len(urls),
            used_memory_before=before,
            used_memory_after=after,
            bytes_per_element=(after - before) / len(urls),
            config=f"INFO memory used_memory, once the client disconnected, minus before "
            f"{len(urls):,} URLs of ~{sum(map(len, urls)) / len(urls):.0f} characters were "
            "queued by " + note(system, "schedule-bulk"),
        ),
    ]


def drains(system: str, redis_url: str, folder: Path) -> list[dict[str, Any]]:
    from benchmarks.peers.run import run_peer

    results = []
    for workload in WORKLOADS:
        tasks = NOOP_TASKS if workload == "noop" else IO_TASKS
        for processes in (1, 2):
            print(f"  {system}: {workload} x{processes}", file=sys.stderr, flush=True)
            flush(redis_url)
            try:
                if system == "crawlq":
                    target = Target(folder, redis_url)
                    results.append(crawlq_bench.drain(target, workload, processes, tasks))
                    results[-1]["suite"] = "redis"
                else:
                    results.append(run_peer(system, workload, processes, tasks, redis_url))
                    results[-1] |= {"suite": "redis", "backend": "redis"}
            except Exception as exc:  # one failure is reported, not fatal
                results.append(failed(system, workload, exc, processes=processes))
    return results


def lateness(system: str, redis_url: str, folder: Path) -> dict[str, Any]:
    """LATE_TASKS delayed tasks through one worker process: how late each one started."""
    flush(redis_url)
    run_dir = Path(tempfile.mkdtemp(prefix=f"late-{system}-", dir=folder))
    marker, late_file = run_dir / "done", run_dir / "late"
    marker.touch()
    late_file.touch()
    namespace = "bench-late"
    if system == "crawlq":
        env = crawlq_bench.worker_env(f"{redis_url}?namespace={namespace}", marker)
        commands = [crawlq_bench.worker_command("late")]
    else:
        from benchmarks.peers.run import _worker_env

        env = _worker_env(redis_url, marker)
        commands = load_peer(system).worker_commands(redis_url, "late", 1)
    env[LATENESS_ENV] = str(late_file)
    client, version = open_client(system, redis_url, namespace)
    try:
        with run_workers(commands, env, run_dir / "workers.log", cwd=REPO_ROOT) as workers:
            # One task through first, so worker start-up is not counted as lateness.
            client.send_late(time.time(), 0.0)
            wait_for_marks(marker, 1, 120, workers)
            started = time.perf_counter()
            for n in range(LATE_TASKS):
                pause = started + n / LATE_PACE - time.perf_counter()
                if pause > 0:
                    time.sleep(pause)
                client.send_late(time.time() + LATE_DELAY, LATE_DELAY)
            schedule_seconds = time.perf_counter() - started
            wait_for_completions(marker, LATE_TASKS + 1, 300, check=workers.check_alive)
    finally:
        client.close()
    lines = late_file.read_text().split()[1:]  # the first is the warm-up task's
    late = sorted(float(line) for line in lines)
    return record(
        system,
        version,
        "lateness",
        tasks=len(late),
        delay=LATE_DELAY,
        pace=LATE_PACE,
        schedule_seconds=schedule_seconds,
        p50_ms=percentile(late, 0.50) * 1000,
        p99_ms=percentile(late, 0.99) * 1000,
        max_ms=late[-1] * 1000,
        min_ms=late[0] * 1000,
        config=note(system, "lateness"),
    )


def wait_for_marks(marker: Path, n: int, timeout: float, workers: Workers) -> None:
    deadline = time.monotonic() + timeout
    while marker.stat().st_size < n:
        workers.check_alive()
        if time.monotonic() > deadline:
            raise TimeoutError(f"{marker}: {n} completions not reached in {timeout:.0f}s")
        time.sleep(0.01)


def claims(system: str, redis_url: str, folder: Path, big: int) -> list[dict[str, Any]]:
    """crawlq: claim_rate on Redis. Peers: CLAIMS dequeues with GROUPS and ``big`` queued."""
    if system == "crawlq":  # both sizes at once, their rounds taking turns
        flush(redis_url)
        measured = crawlq_bench.claim_step(Target(folder, redis_url), (GROUPS, big))
        return [r | {"suite": "redis"} for r in measured]
    results = []
    for queued in (GROUPS, big):
        flush(redis_url)
        client, version = open_client(system, redis_url, "")
        try:
            started = time.perf_counter()
            client.fill(queued)
            fill_seconds = time.perf_counter() - started
            started = time.perf_counter()
            client.dequeue(CLAIMS)
            seconds = time.perf_counter() - started
        finally:
            client.close()
        results.append(
            record(
                system,
                version,
                "dequeue",
                tasks=CLAIMS,
                seconds=seconds,
                rate=CLAIMS / seconds,
                queued=queued,
                fill_seconds=fill_seconds,
                config=note(system, "dequeue") + "; no groups or politeness: not comparable "
                "with crawlq's claim on that",
            )
        )
    return results


def _lateness(system: str, redis_url: str, folder: Path) -> list[dict[str, Any]]:
    return [lateness(system, redis_url, folder)]


def failed(system: str, workload: str, exc: BaseException, **fields: Any) -> dict[str, Any]:
    print(f"   FAILED: {system} {workload}: {exc}", file=sys.stderr, flush=True)
    error = f"{type(exc).__name__}: {str(exc)[:300]}"
    return {"suite": "redis", "system": system, "workload": workload, "error": error, **fields}


def run_all(
    redis_url: str,
    *,
    systems: Sequence[str] = SYSTEMS,
    measures: Sequence[str] = MEASURES,
    big: int = 1_000_000,
    on_record: Callable[[list[dict[str, Any]]], None] | None = None,
) -> list[dict[str, Any]]:
    """Every measure for every system on the redis-server at ``redis_url`` (it gets FLUSHALL)."""
    results: list[dict[str, Any]] = []
    # Peer tasks that mark completions in this process (arq's dequeue runs its worker here).
    with tempfile.TemporaryDirectory(prefix="crawlq-redis-bench-") as tmp, _marker(Path(tmp)):
        folder = Path(tmp)
        steps: list[tuple[str, str, Callable[[], list[dict[str, Any]]]]] = []
        for system in systems:
            if "schedule" in measures:
                steps.append((system, "schedule", partial(schedule_and_memory, system, redis_url)))
            if "drain" in measures:
                steps.append((system, "drain", partial(drains, system, redis_url, folder)))
            if "lateness" in measures:
                steps.append((system, "lateness", partial(_lateness, system, redis_url, folder)))
            if "claim" in measures:
                steps.append((system, "claim", partial(claims, system, redis_url, folder, big)))
        for system, measure, step in steps:
            print(f"redis: {system} {measure} ...", file=sys.stderr, flush=True)
            try:
                results.extend(step())
            except Exception as exc:  # one failure is reported, not fatal
                results.append(failed(system, measure, exc))
            if on_record is not None:
                on_record(results)
    return results


@contextmanager
def _marker(folder: Path) -> Iterator[None]:
    old = os.environ.get(MARKER_ENV)
    os.environ[MARKER_ENV] = str(folder / "in-process-done")
    try:
        yield
    finally:
        if old is None:
            del os.environ[MARKER_ENV]
        else:
            os.environ[MARKER_ENV] = old


@contextmanager
def server(url: str | None) -> Iterator[str]:
    if url is not None:
        yield url
    else:
        with redis_server() as started:
            yield started


def main(argv: Sequence[str] | None = None) -> list[dict[str, Any]]:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--system", choices=SYSTEMS, action="append", help="default: all")
    parser.add_argument("--only", choices=MEASURES, action="append", help="default: all")
    parser.add_argument("--big", type=int, default=1_000_000, help="queued for the big claim")
    parser.add_argument("--redis-url", help="use this Redis (it gets FLUSHALL), not our own")
    parser.add_argument("--json", type=Path, help="write the result records here")
    args = parser.parse_args(argv)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # unwind: stop workers, server

    def save(results: list[dict[str, Any]]) -> None:
        if args.json:
            args.json.write_text(json.dumps(results, indent=2) + "\n")

    with server(args.redis_url) as url:
        results = run_all(
            url,
            systems=args.system or SYSTEMS,
            measures=args.only or MEASURES,
            big=args.big,
            on_record=save,
        )
    for r in results:
        print(json.dumps(r))
    return results


if __name__ == "__main__":
    main()
