"""What a host's own limit rule costs as a crawl grows: a crawl sets one for each host whose
robots.txt has a Crawl-delay, so a broad crawl holds thousands of them.

    python -m benchmarks.limits_bench [--hosts 2000 20000] [--calls 50] [--backends sqlite redis]

For each backend and each number of hosts H: H hosts get an element each (H groups), then
`calls` times a rule for one more host is set (`Backend.set_limits`, as a Crawl-delay does),
and then, once a tenth of the hosts have such a rule, `calls` URLs on new hosts are
scheduled one a call. Each is reported in ms a call, with the ratio of the largest H to the
smallest: a cost that does not grow with the crawl stays near 1. The Redis runs use a
redis-server the benchmark starts on a loopback port.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import tempfile
import time
from collections.abc import Iterator
from typing import Any

from crawlq import App
from crawlq.testing.redis_server import redis_server
from crawlq.types import Limit, LimitRule

BATCH = 1000


def host_rule(n: int) -> LimitRule:
    return LimitRule(pattern=f"h{n}.test", limit=Limit(concurrency=1, interval=2.0))


async def measure(url: str, hosts: int, calls: int) -> dict[str, float]:
    app = App(url)

    @app.task()
    async def page(ctx: Any, link: str) -> None:
        """Never runs: the benchmark only schedules."""

    backend = await app.backend()
    try:
        links = [f"http://h{n}.test/" for n in range(hosts)]
        for start in range(0, hosts, BATCH):
            await app.aschedule_many(page, links[start : start + BATCH], backend=backend)
        # A tenth of the hosts with a Crawl-delay: a rule each, set one at a time, as a crawl
        # does; the first `calls` of them timed.
        started = time.perf_counter()
        for n in range(calls):
            await backend.set_limits([host_rule(n)])
        set_rule = (time.perf_counter() - started) / calls
        await backend.set_limits([host_rule(n) for n in range(calls, hosts // 10)])
        started = time.perf_counter()
        for n in range(calls):
            await app.aschedule(page, f"http://new{n}.test/", backend=backend)
        schedule_new = (time.perf_counter() - started) / calls
        return {"set_rule_ms": set_rule * 1e3, "schedule_new_host_ms": schedule_new * 1e3}
    finally:
        await app.aclose()


@contextlib.contextmanager
def backend_url(kind: str) -> Iterator[str]:
    if kind == "redis":
        with redis_server() as url:
            yield url
    else:
        with tempfile.TemporaryDirectory() as folder:
            yield f"sqlite:///{folder}/queue.db"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else "")
    parser.add_argument("--hosts", type=int, nargs="+", default=[2000, 20000])
    parser.add_argument("--calls", type=int, default=50)
    parser.add_argument("--backends", nargs="+", default=["sqlite", "redis"])
    args = parser.parse_args(argv)
    print(
        f"# python -m benchmarks.limits_bench, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}"
    )
    print("| backend | hosts (groups) | set one host's rule, ms | schedule on a new host, ms |")
    print("|---|---|---|---|")
    for kind in args.backends:
        results = {}
        for hosts in args.hosts:
            with backend_url(kind) as url:
                results[hosts] = asyncio.run(measure(url, hosts, args.calls))
            set_ms, new_ms = results[hosts]["set_rule_ms"], results[hosts]["schedule_new_host_ms"]
            print(f"| {kind} | {hosts:,} | {set_ms:.2f} | {new_ms:.2f} |", flush=True)
        low, high = results[min(args.hosts)], results[max(args.hosts)]
        print(
            f"| {kind} | {max(args.hosts):,} / {min(args.hosts):,} | "
            f"{high['set_rule_ms'] / low['set_rule_ms']:.1f}x | "
            f"{high['schedule_new_host_ms'] / low['schedule_new_host_ms']:.1f}x |",
            flush=True,
        )


if __name__ == "__main__":
    main()
