"""crawlq's queue benchmarks on the embedded SQLite backend (or another backend URL).

    python -m benchmarks.crawlq_bench [--json OUT] [--big 1000000]

The workloads take a backend URL (`Target`), so benchmarks.redis_compare runs the same
code on Redis; run from here they use SQLite files in a temporary folder.

- schedule rate: single schedules (one transaction each) and bulk (batches of 10,000);
- drain rate of no-op tasks and the I/O workload (2,000 tasks sleeping 50 ms) with 1 and
  2 worker processes, measured like the peers' (benchmarks.common);
- claim rate with 10,000 and with 1,000,000 queued elements in 10,000 groups, 90% blocked;
- a worker's peak RSS while draining 20,000 elements from queues of 20,000, 1,000,000 and
  2,000,000 elements.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from functools import partial
from pathlib import Path
from typing import Any

import crawlq
from benchmarks.common import MARKER_ENV, PeakRSS, run_workers, wait_for_completions
from crawlq.backends import Backend, open_backend
from crawlq.tasks import prepare
from crawlq.types import Limit, LimitRule, QueueConfig

REPO_ROOT = Path(__file__).resolve().parents[1]
NOOP_TASKS = 20_000
IO_TASKS = 2_000
GROUPS = 10_000
CLAIMS = 1_000
CLAIM_ROUNDS = 7
WORKER_SLOTS = "500"


class Target:
    """Where the workloads keep their queues: one fresh backend URL per name.

    SQLite: a file per name in ``folder``. Redis: a namespace per name on one server
    (``redis_url`` without a query), so runs never see each other's elements.
    """

    def __init__(self, folder: Path, redis_url: str | None = None) -> None:
        self.folder = folder
        self.redis_url = redis_url
        self.backend = "sqlite" if redis_url is None else "redis"

    def url(self, name: str) -> str:
        if self.redis_url is None:
            return f"sqlite:///{self.folder / name}.db"
        return f"{self.redis_url}?namespace=bench-{name}"

    def describe(self) -> str:
        return "SQLite WAL" if self.redis_url is None else "Redis"


def result(name: str, backend: str = "sqlite", **fields: Any) -> dict[str, Any]:
    return {
        "system": "crawlq",
        "version": crawlq.__version__,
        "backend": backend,
        "workload": name,
        **fields,
    }


def timed(
    name: str, tasks: int, seconds: float, config: str, backend: str = "sqlite", **fields: Any
) -> dict[str, Any]:
    """A result whose rate is simply tasks over seconds."""
    return result(
        name, backend, tasks=tasks, seconds=seconds, rate=tasks / seconds, config=config, **fields
    )


async def opened(url: str) -> Backend:
    """The backend of `url`, open."""
    backend = open_backend(url)
    await backend.open()
    return backend


async def schedule_rates(target: Target) -> list[dict[str, Any]]:
    app = crawlq.App(target.url("schedule"))
    single = app.task(group=None, queue="single")(lambda ctx, n: None)
    bulk = app.task(queue="bulk")(lambda ctx, n: None)
    singles = 5_000
    started = time.perf_counter()
    for n in range(singles):
        await app.aschedule(single, n)
    single_seconds = time.perf_counter() - started
    urls = [f"http://site{n % 1000}.bench/page/{n}" for n in range(200_000)]
    started = time.perf_counter()
    for offset in range(0, len(urls), 10_000):
        await app.aschedule_many(bulk, urls[offset : offset + 10_000])
    bulk_seconds = time.perf_counter() - started
    plain = app.task(group=None, queue="plain")(lambda ctx, n: None)
    started = time.perf_counter()
    for offset in range(0, len(urls), 10_000):
        await app.aschedule_many(plain, range(offset, offset + 10_000))
    plain_seconds = time.perf_counter() - started
    await app.aclose()
    b = target.backend
    return [
        timed(
            "schedule-single",
            singles,
            single_seconds,
            "await app.aschedule(), one element a call",
            b,
        ),
        timed(
            "schedule-bulk",
            len(urls),
            bulk_seconds,
            "await app.aschedule_many(), 10,000 URLs in 1,000 hosts a call",
            b,
        ),
        timed(
            "schedule-bulk-plain",
            len(urls),
            plain_seconds,
            "await app.aschedule_many(), 10,000 integers (no group) a call",
            b,
        ),
    ]


def worker_env(backend_url: str, marker: Path) -> dict[str, str]:
    """The environment of `crawlq worker benchmarks.crawlq_app:app` processes."""
    env = dict(os.environ)
    env.update(CRAWLQ_BACKEND=backend_url, PYTHONPATH=str(REPO_ROOT))
    env[MARKER_ENV] = str(marker)
    return env


def worker_command(workload: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "crawlq",
        "worker",
        "benchmarks.crawlq_app:app",
        "--queue",
        workload,
        "-c",
        WORKER_SLOTS,
    ]


def bench_app(backend_url: str) -> crawlq.App:
    """An app on ``backend_url`` that knows the tasks of benchmarks.crawlq_app."""
    from benchmarks import crawlq_app

    app = crawlq.App(backend_url)
    app.tasks = dict(crawlq_app.app.tasks)
    return app


def drain(
    target: Target, workload: str, processes: int, tasks: int, queued: int = 0
) -> dict[str, Any]:
    """Schedules `queued` (default `tasks`) elements, starts workers, times `tasks` completions."""
    run_dir = Path(tempfile.mkdtemp(prefix=f"{workload}-{processes}-", dir=target.folder))
    marker = run_dir / "done"
    backend_url = target.url(f"{run_dir.name}/queue" if target.redis_url is None else run_dir.name)
    env = worker_env(backend_url, marker)
    app = bench_app(backend_url)
    enqueue_started = time.perf_counter()
    total = queued or tasks
    for offset in range(0, total, 50_000):
        app.schedule_many(workload, range(offset, min(total, offset + 50_000)))
    enqueue_seconds = time.perf_counter() - enqueue_started
    app.close()
    command = worker_command(workload)
    log = run_dir / "workers.log"
    with (
        run_workers([command] * processes, env, log, cwd=REPO_ROOT) as workers,
        PeakRSS([p.pid for p in workers.procs]) as rss,
    ):
        measured = wait_for_completions(marker, tasks, 300, check=workers.check_alive)
    return result(
        workload,
        target.backend,
        processes=processes,
        tasks=tasks,
        queued=total,
        enqueue_seconds=enqueue_seconds,
        seconds=measured.seconds,
        rate=measured.rate,
        peak_rss_mb=rss.peak_mb,
        memory=queued > 0,
        config=f"{target.describe()}, {processes} x `crawlq worker -c {WORKER_SLOTS}`",
    )


async def fill_claims(target: Target, queued: int) -> tuple[str, float]:
    """A queue of `queued` elements in GROUPS groups, 90% of them blocked, its backend
    closed (a SQLite file checkpointed) again: its URL and the seconds the fill took."""
    url = target.url(f"claims-{queued}")
    backend = await opened(url)
    config = QueueConfig(name="pages")
    await backend.ensure_queues([config])
    await backend.set_limits([LimitRule(pattern="*", limit=Limit())])
    started = time.perf_counter()
    now = backend.now()
    batch: list[Any] = []
    for n in range(queued):
        batch.append(prepare(config, f"http://g{n % GROUPS}.bench/{n}", due=now))
        if len(batch) == 50_000:
            await backend.schedule(batch)
            batch = []
    if batch:
        await backend.schedule(batch)
    fill_seconds = time.perf_counter() - started
    for g in range(GROUPS):
        if g % 10:
            await backend.block_group(f"g{g}.bench", now + 86_400, "benchmark")
    await backend.close()
    return url, fill_seconds


async def _claim_round(backend: Backend, per_claim: int) -> float:
    """Claims CLAIMS elements `per_claim` a claim (timed), then gives them back (not timed):
    the claims a second."""
    taken: list[Any] = []
    started = time.perf_counter()
    while len(taken) < CLAIMS:
        got = await backend.claim(["pages"], worker="bench", limit=per_claim, lease=600)
        if not got.elements:
            raise RuntimeError(f"only {len(taken)} claimable in {backend.url}")
        taken.extend(got.elements)
    rate = CLAIMS / (time.perf_counter() - started)
    await backend.release(taken)
    return rate


async def claim_rate(target: Target, sizes: Sequence[int]) -> list[dict[str, Any]]:
    """Claims CLAIMS elements, one a claim and 100 a claim, from a queue of each size in
    `sizes`, with 90% of 10,000 groups blocked.

    Every queue is filled, its groups blocked and its backend closed (checkpointed) first.
    Then, each on one open backend as a worker keeps it, CLAIM_ROUNDS rounds claim CLAIMS
    elements (timed) and release them (not timed), the sizes taking turns round by round:
    the target is a ratio between sizes, and a slow spell of the shared machine then falls
    on all of them alike rather than on whichever size was measured during it. The rate is
    the median round's, and the first (cold) round's is kept beside it. One round is only
    ~0.1 s, so a single one says more about when a checkpoint fell than about the claim.
    """
    filled = {queued: await fill_claims(target, queued) for queued in sizes}
    results = []
    for per_claim in (1, 100):
        backends = {queued: await opened(url) for queued, (url, _) in filled.items()}
        rates: dict[int, list[float]] = {queued: [] for queued in sizes}
        for _ in range(CLAIM_ROUNDS):
            for queued, backend in backends.items():
                rates[queued].append(await _claim_round(backend, per_claim))
        for backend in backends.values():
            await backend.close()
        for queued in sizes:
            rate = statistics.median(rates[queued])
            results.append(
                result(
                    "claim",
                    tasks=CLAIMS,
                    seconds=CLAIMS / rate,
                    rate=rate,
                    cold_rate=rates[queued][0],
                    rounds=CLAIM_ROUNDS,
                    config=(
                        f"backend.claim(limit={per_claim}) in a loop, one transaction each; "
                        f"median of {CLAIM_ROUNDS} rounds of {CLAIMS:,} on one open backend, "
                        f"taking turns with the queue{'s' if len(sizes) > 2 else ''} of "
                        + " and ".join(f"{other:,}" for other in sizes if other != queued)
                    ),
                    backend=target.backend,
                    queued=queued,
                    groups=GROUPS,
                    blocked_groups=GROUPS * 9 // 10,
                    per_claim=per_claim,
                    fill_seconds=filled[queued][1],
                )
            )
    return results


def _schedule_step(target: Target) -> list[dict[str, Any]]:
    return asyncio.run(schedule_rates(target))


def claim_step(target: Target, sizes: Sequence[int]) -> list[dict[str, Any]]:
    return asyncio.run(claim_rate(target, sizes))


def _drain_step(
    target: Target, workload: str, processes: int, tasks: int, queued: int = 0
) -> list[dict[str, Any]]:
    return [drain(target, workload, processes, tasks, queued)]


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--json", type=Path, help="write the results here")
    parser.add_argument("--big", type=int, default=1_000_000, help="elements of the big queue")
    parser.add_argument("--only", choices=["schedule", "drain", "claim", "memory"], action="append")
    args = parser.parse_args(argv)
    only: set[str] = set(args.only or ["schedule", "drain", "claim", "memory"])
    results: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="crawlq-bench-") as tmp:
        folder = Path(tmp)
        target = Target(folder)
        steps: list[tuple[str, Callable[[], list[dict[str, Any]]]]] = []
        if "schedule" in only:
            steps.append(("schedule", partial(_schedule_step, target)))
        if "drain" in only:
            for workload, tasks in (("noop", NOOP_TASKS), ("io", IO_TASKS)):
                for processes in (1, 2):
                    step = partial(_drain_step, target, workload, processes, tasks)
                    steps.append((f"{workload} x{processes}", step))
        if "claim" in only:
            sizes = (GROUPS, args.big)
            steps.append((f"claim {sizes}", partial(claim_step, target, sizes)))
        if "memory" in only:
            for queued in (NOOP_TASKS, args.big, 2 * args.big):
                step = partial(_drain_step, target, "noop", 1, NOOP_TASKS, queued)
                steps.append((f"memory {queued}", step))
        for label, run_step in steps:
            print(f"crawlq: {label} ...", file=sys.stderr, flush=True)
            results.extend(run_step())
    for r in results:
        print(json.dumps(r))
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))
    return results


if __name__ == "__main__":
    main()
