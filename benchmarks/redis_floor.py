"""What a single call on Redis costs crawlq's client alone, set against Huey's whole call.

    python -m benchmarks.redis_floor [--rounds 7] [--redis-url URL] [--json OUT]

Issue 3 asks for single schedules and single claims faster than Huey's (one LPUSH, one
RPOP, from its synchronous client). This splits crawlq's single call in two, on one
redis-server, one system at a time in rounds that take turns (a slow spell of the shared
machine then falls on every variant alike), the median round reported:

- crawlq as it is: `await app.aschedule(task, url)`, and `backend.claim(limit=1)` from a
  queue of 100,000 elements in the claim benchmark's groups (crawlq_bench: 10,000 groups,
  9,000 of them blocked);
- crawlq with the server's work taken away: the same calls, with the operation's Redis
  function swapped for one that does nothing and returns a fixed reply of the real one's
  shape (a schedule's counts; a claim of one element, as a real claim's reply), so the client
  sends, waits, parses and builds its result exactly as it does for real;
- Huey: `task(url)` (one LPUSH) and `huey.dequeue()` (one RPOP), as redis_compare runs them;
- crawlq's schedule from plain synchronous code, as Huey's is: `app.schedule(task, url)`,
  which runs the app's private event loop on the calling thread (crawlq.portal).

If the client alone is no faster than Huey's whole call, no cheaper operation on the server
can put crawlq's single call ahead: what is left is the event loop's round trip and the API.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from functools import partial
from pathlib import Path
from typing import Any

import redis

from benchmarks import crawlq_bench
from benchmarks.crawlq_bench import Target
from benchmarks.redis_compare import CrawlqClient, flush, open_client, server, url_of
from crawlq.backends.redis import scripts

CALLS = 2_000
ROUNDS = 7
#: What is measured of each call, in the tables' order.
VARIANTS = ("crawlq", "crawlq client alone", "huey")
#: Measured of the schedule only: the same call from plain synchronous code, as Huey's is.
SYNC = "crawlq sync API"
#: Functions of the same calling convention as crawlq's (KEYS[1] the anchor, ARGV the
#: prefix, the clock and the arguments) that do no work: a schedule's reply says one element
#: added; a claim's takes one element, read by the client as a real claim's.
IDLE_LIBRARY = """#!lua name=crawlq_floor
redis.register_function('crawlq_floor_schedule', function(KEYS, ARGV)
    return cmsgpack.pack({1, 0, 0, 0, 0})
end)
redis.register_function('crawlq_floor_claim', function(KEYS, ARGV)
    local t = redis.call('TIME')
    local now = tonumber(t[1]) + tonumber(t[2]) / 1e6
    local url = 'http://g0.bench/0'
    return cmsgpack.pack({false, now, {'pages', url, url, 'g0.bench', 0, now, 1, 1}})
end)
"""


@contextmanager
def idle_server_work(operation: str) -> Iterator[None]:
    """crawlq's calls of `operation` go to its idle stand-in while inside."""
    real = scripts.function_name
    scripts.command_head.cache_clear()  # it caches the function's name in each head
    scripts.function_name = lambda op: f"crawlq_floor_{op}" if op == operation else real(op)  # type: ignore[assignment]
    try:
        yield
    finally:
        scripts.function_name = real
        scripts.command_head.cache_clear()


def rate(calls: int, run: Callable[[], None]) -> float:
    started = time.perf_counter()
    run()
    return calls / (time.perf_counter() - started)


def schedules(redis_url: str, rounds: int) -> dict[str, list[float]]:
    flush(redis_url)
    crawlq = CrawlqClient(f"{redis_url}?namespace=floor")
    huey, _ = open_client("huey", redis_url, "")
    urls = iter(url_of(n) for n in range(10**9))

    def batch() -> list[str]:
        return [next(urls) for _ in range(CALLS)]

    rates: dict[str, list[float]] = {variant: [] for variant in (*VARIANTS, SYNC)}
    try:
        crawlq.send_each([next(urls)])  # the backend's first call loads the library
        crawlq.send_each_sync([next(urls)])  # and the sync API's first opens its own
        for _ in range(rounds):
            rates["crawlq"].append(rate(CALLS, partial(crawlq.send_each, batch())))
            with idle_server_work("schedule"):
                sent = partial(crawlq.send_each, batch())
                rates["crawlq client alone"].append(rate(CALLS, sent))
            rates["huey"].append(rate(CALLS, partial(huey.send_each, batch())))
            rates[SYNC].append(rate(CALLS, partial(crawlq.send_each_sync, batch())))
    finally:
        crawlq.close()
        huey.close()
    return rates


def claims(redis_url: str, rounds: int) -> dict[str, list[float]]:
    flush(redis_url)
    rates: dict[str, list[float]] = {variant: [] for variant in VARIANTS}
    huey, _ = open_client("huey", redis_url, "")
    huey.fill(rounds * CALLS + CALLS)
    with tempfile.TemporaryDirectory(prefix="redis-floor-") as folder:
        target = Target(Path(folder), redis_url)

        async def run() -> None:
            url, _ = await crawlq_bench.fill_claims(target, crawlq_bench.GROUPS * 10)
            backend = await crawlq_bench.opened(url)

            async def timed(claim: Callable[[], Awaitable[Any]], real: bool = True) -> float:
                taken = []
                started = time.perf_counter()
                for _ in range(CALLS):
                    taken.extend((await claim()).elements)
                seconds = time.perf_counter() - started
                if real:  # given back, untimed, for the next round (the stand-in's are made up)
                    assert len(taken) == CALLS, f"only {len(taken)} claimable"
                    await backend.release(taken)
                return CALLS / seconds

            def claim() -> Awaitable[Any]:
                return backend.claim(["pages"], worker="floor", limit=1, lease=60.0)

            try:
                for _ in range(rounds):
                    rates["crawlq"].append(await timed(claim))
                    with idle_server_work("claim"):
                        rates["crawlq client alone"].append(await timed(claim, real=False))
                    rates["huey"].append(rate(CALLS, lambda: huey.dequeue(CALLS)))
            finally:
                await backend.close()

        try:
            asyncio.run(run())
        finally:
            huey.close()
    return rates


def measure(redis_url: str, rounds: int = ROUNDS) -> list[dict[str, Any]]:
    """The records of every variant of both calls, on this server (it gets FLUSHALL)."""
    redis.Redis.from_url(redis_url).function_load(IDLE_LIBRARY, replace=True)
    results = []
    for call, run in (("schedule", schedules), ("claim", claims)):
        rates = run(redis_url, rounds)
        huey = statistics.median(rates["huey"])
        for variant, measured in rates.items():
            median = statistics.median(measured)
            results.append(
                {
                    "suite": "floor",
                    "call": call,
                    "variant": variant,
                    "rate": median,
                    "vs_huey": median / huey,
                    "rounds": [round(r) for r in measured],
                    "calls_a_round": CALLS,
                }
            )
    return results


def table(results: list[dict[str, Any]]) -> str:
    """The floor's records as a markdown table, a row per call ("" if there are none)."""
    floor = [r for r in results if r.get("suite") == "floor"]
    if not floor:
        return ""
    rows = [
        "| one call a time (/s) | crawlq | crawlq, client alone | crawlq sync API | huey | "
        "crawlq vs huey | client alone vs huey | sync API vs huey |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for call in ("schedule", "claim"):
        by = {r["variant"]: r for r in floor if r["call"] == call}
        ours, alone, huey = (by[variant] for variant in VARIANTS)
        sync = by.get(SYNC)  # a claim has no sync API
        sync_rate, sync_ratio = (
            (f"{sync['rate']:,.0f}", f"{sync['vs_huey']:.2f}x") if sync else ("-", "-")
        )
        rows.append(
            f"| {call} | {ours['rate']:,.0f} | {alone['rate']:,.0f} | {sync_rate} | "
            f"{huey['rate']:,.0f} | {ours['vs_huey']:.2f}x | {alone['vs_huey']:.2f}x | "
            f"{sync_ratio} |"
        )
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--rounds", type=int, default=ROUNDS)
    parser.add_argument("--redis-url", help="use this Redis (it gets FLUSHALL), not our own")
    parser.add_argument("--json", type=Path, help="write the result records here")
    args = parser.parse_args(argv)
    with server(args.redis_url) as url:
        results = measure(url, args.rounds)
    print(table(results))
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n")
    return results


if __name__ == "__main__":
    main()
