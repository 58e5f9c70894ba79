"""The HTTP client's floor: what the throughput crawl's requests cost aiohttp alone.

    python -m benchmarks.client_floor [--config throughput] [--rounds 3]

The crawl benchmark's synthetic web (its own process, as in a crawl), and in this process a
bare aiohttp session fetching every page of every site once: the crawl's connection limits
(its per-domain concurrency, its overall concurrency), the same static resolve map, no
queue, no robots.txt, no parsing, no storage. Reported: this process's CPU a request, the
best of `rounds` rounds. Set against a crawl's CPU a page, it says how much of that is the
client's and how much crawlq's own.
"""

from __future__ import annotations

import argparse
import asyncio
import resource
import socket
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp.abc import AbstractResolver, ResolveResult

from crawlq.worker import collect_less_often

from .crawl_bench import CONFIGS, Config, Server


class StaticResolver(AbstractResolver):
    def __init__(self, addresses: dict[str, str]) -> None:
        self.addresses = addresses

    async def resolve(
        self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET
    ) -> list[ResolveResult]:
        return [
            ResolveResult(
                hostname=host,
                host=self.addresses[host],
                port=port,
                family=socket.AF_INET,
                proto=0,
                flags=0,
            )
        ]

    async def close(self) -> None:
        pass


def cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


async def one_round(config: Config, server: Server) -> tuple[float, float]:
    """CPU seconds a request, and requests a second, for every page once."""
    # Page n of every site, then page n + 1: in a site's order, the first `concurrency`
    # requests would be a few sites', most of them waiting for their host's connections.
    urls = [
        f"http://{name}:{port}/page/{n}"
        for n in range(config.pages)
        for name, (_, port) in server.sites.items()
    ]
    connector = aiohttp.TCPConnector(
        limit=config.concurrency,
        limit_per_host=config.per_domain,
        resolver=StaticResolver(server.resolve()),
    )
    async with aiohttp.ClientSession(connector=connector) as session:
        gate = asyncio.Semaphore(config.concurrency)

        async def get(url: str) -> Any:
            async with gate, session.get(url) as response:
                return await response.read()

        started_cpu, started = cpu_seconds(), time.perf_counter()
        await asyncio.gather(*(get(url) for url in urls))
        cpu, wall = cpu_seconds() - started_cpu, time.perf_counter() - started
    return cpu / len(urls), len(urls) / wall


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--config", choices=sorted(CONFIGS), default="throughput")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)
    config = CONFIGS[args.config]
    collect_less_often()  # as crawlq's commands
    best: tuple[float, float] | None = None
    for _ in range(args.rounds):
        with (
            tempfile.TemporaryDirectory(prefix="client-floor-") as work,
            Server(config, Path(work)) as server,
        ):
            measured = asyncio.run(one_round(config, server))
        best = measured if best is None or measured[0] < best[0] else best
        print(f"round: {measured[0] * 1000:.3f} ms of CPU a request, {measured[1]:,.0f}/s")
    assert best is not None
    print(
        f"{config.name}: aiohttp alone, {config.sites * config.pages:,} GETs:"
        f" {best[0] * 1000:.3f} ms of CPU a request (best of {args.rounds}), {best[1]:,.0f}/s"
    )


if __name__ == "__main__":
    main()
