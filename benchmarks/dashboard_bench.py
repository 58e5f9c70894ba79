"""Dashboard and /metrics page loads on a queue of 10,000,000 elements (issue 6, cost).

    .venv/bin/python -m benchmarks.dashboard_bench                     # SQLite, 10,000,000
    .venv/bin/python -m benchmarks.dashboard_bench --backend redis --elements 1000000

Fills one queue (`pages`) with URLs in `--groups` hosts (90% due, 10% delayed a day), leases
1,000 of them (running), dead-letters 1,000 and blocks 1,000 hosts; then starts the real
`crawlq dashboard --cache 0` (every load reads the backend afresh) and times each page over
HTTP on loopback, `--repeat` times, plus each backend call the pages make, in this process.
Prints a Markdown table and one JSON line.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from crawlq.backends import Backend, open_backend
from crawlq.tasks import prepare
from crawlq.testing.redis_server import RedisServer
from crawlq.types import Claimed, Failure, Limit, LimitRule, QueueConfig

PAGES = [
    "/",
    "/groups",
    "/groups?q=h77",
    "/workers",
    "/dead?queue=pages",
    '/element?queue=pages&key="http://h1.bench/p/1"',
    "/metrics",
]
BATCH = 50_000
SPECIAL = 1_000


async def fill(backend: Backend, elements: int, groups: int) -> float:
    config = QueueConfig(name="pages")
    await backend.ensure_queues([config])
    await backend.set_limits([LimitRule(pattern="*", limit=Limit(concurrency=4))])
    started = time.perf_counter()
    now = backend.now()
    batch = []
    for n in range(elements):
        due = now + 86_400 if n % 10 == 9 else now
        batch.append(prepare(config, f"http://h{n % groups}.bench/p/{n}", due=due))
        if len(batch) == BATCH:
            await backend.schedule(batch)
            batch = []
            if n % 1_000_000 < BATCH:
                print(f"  {n + 1:,} scheduled", file=sys.stderr, flush=True)
    if batch:
        await backend.schedule(batch)
    claimed: list[Claimed] = []
    while len(claimed) < 2 * SPECIAL:
        got = await backend.claim(["pages"], worker="bench", limit=100, lease=86_400)
        claimed += got.elements
    await backend.fail(
        [Failure(element=c, error="bench: gave up", traceback="") for c in claimed[:SPECIAL]]
    )
    for g in range(SPECIAL):
        await backend.block_group(f"h{groups - 1 - g}.bench", now + 86_400, "bench: Retry-After")
    return time.perf_counter() - started


async def timed(call: Callable[[], Awaitable[Any]], repeat: int) -> list[float]:
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        await call()
        times.append(time.perf_counter() - started)
    return times


async def backend_calls(backend: Backend, repeat: int) -> dict[str, list[float]]:
    return {
        "queue_stats()": await timed(backend.queue_stats, repeat),
        "group_stats(limit=200)": await timed(lambda: backend.group_stats(limit=200), repeat),
        "group_stats('*h77*', limit=200)": await timed(
            lambda: backend.group_stats("*h77*", limit=200), repeat
        ),
        "workers()": await timed(backend.workers, repeat),
        "dead_letters(limit=50)": await timed(
            lambda: backend.dead_letters("pages", limit=50), repeat
        ),
        "dead_letters(limit=500) (element page)": await timed(
            lambda: backend.dead_letters("pages", limit=500), repeat
        ),
    }


def get(url: str) -> float:
    started = time.perf_counter()
    with urllib.request.urlopen(url, timeout=600) as response:
        response.read()
        if response.status != 200:
            raise RuntimeError(f"{url}: HTTP {response.status}")
    return time.perf_counter() - started


def page_loads(url: str, repeat: int) -> dict[str, list[float]]:
    env = {**os.environ, "CRAWLQ_BACKEND": url}
    env.pop("CRAWLQ_DASHBOARD_TOKEN", None)
    server = subprocess.Popen(
        [sys.executable, "-m", "crawlq", "dashboard", "--port", "0", "--cache", "0"],
        env=env,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert server.stdout is not None
        line = server.stdout.readline()
        if "http://" not in line:
            raise RuntimeError(f"dashboard did not start: {line!r}")
        base = line.split()[-1].rstrip("/")
        results = {}
        for page in PAGES:
            target = base + urllib.parse.quote(page, safe="/?=&")
            get(target)  # the first load warms the page cache; then measure
            results[page] = [get(target) for _ in range(repeat)]
        return results
    finally:
        server.terminate()
        server.wait(timeout=30)


def summary(times: list[float]) -> str:
    return f"{statistics.median(times) * 1000:,.1f} ms (max {max(times) * 1000:,.1f})"


async def measure(url: str, elements: int, groups: int, repeat: int) -> dict[str, Any]:
    backend = open_backend(url)
    await backend.open()
    try:
        print(f"filling {elements:,} elements in {groups:,} groups", file=sys.stderr)
        fill_seconds = await fill(backend, elements, groups)
        stats = await backend.queue_stats()
    finally:
        await backend.close()
    backend = open_backend(url)
    await backend.open()
    try:
        calls = await backend_calls(backend, repeat)
    finally:
        await backend.close()
    loads = await asyncio.to_thread(page_loads, url, repeat)
    return {
        "elements": elements,
        "groups": groups,
        "fill_seconds": fill_seconds,
        "queues": [q.__repr__() for q in stats],
        "pages": loads,
        "calls": calls,
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else "")
    parser.add_argument("--backend", choices=["sqlite", "redis"], default="sqlite")
    parser.add_argument("--elements", type=int, default=10_000_000)
    parser.add_argument("--groups", type=int, default=100_000)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="crawlq-dashboard-bench-") as folder:
        server = None
        if args.backend == "redis":
            server = RedisServer()
            server.start()
            url = f"{server.url}?namespace=dashboard-bench"
        else:
            url = f"sqlite:///{Path(folder) / 'big.db'}"
        try:
            found = asyncio.run(measure(url, args.elements, args.groups, args.repeat))
        finally:
            if server is not None:
                server.remove()
    found["backend"] = args.backend
    print(
        f"\n{args.backend}, {args.elements:,} elements in {args.groups:,} groups "
        f"(filled in {found['fill_seconds']:.0f} s); median of {args.repeat}:\n"
    )
    print("| page (HTTP GET, --cache 0) | load time |\n|---|---|")
    for page, times in found["pages"].items():
        print(f"| `{page}` | {summary(times)} |")
    print("\n| backend call | time |\n|---|---|")
    for call, times in found["calls"].items():
        print(f"| `{call}` | {summary(times)} |")
    print(json.dumps(found))


if __name__ == "__main__":
    main()
