"""The demo ETL at full size against the same ETL written the legacy way, in the same run.

    .venv/bin/python -m benchmarks.etl_bench                       # 20,000 reports, 50 ms
    .venv/bin/python -m benchmarks.etl_bench --reports 2000 --markdown

Both jobs read the same partner sites (the demo's: 8 sub-domains on 127.0.3.x, a login,
HTML/CSV/JSON reports, 2% failing once), served with the proxy by a separate process, and
both must keep to 4 requests at once per sub-domain. crawlq: the demo's pipeline (listing,
download to WARC, parse, normalize into the results store) on SQLite, once in one worker
process and once with parse and normalize in a second process.
Legacy: a thread pool over the report URLs, a shared per-domain counter checked before each
request, urllib with a cookie jar per sub-domain, results in SQLite: how such jobs are
usually first written. Violations are counted from the sites' own log: requests that arrived
while 4 others of their sub-domain were in flight.
"""

from __future__ import annotations

import argparse
import asyncio
import http.cookiejar
import json
import os
import platform
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections import defaultdict
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from rich.console import Console

from crawlq.demo.etl import PARSERS, EtlConfig, build, summarize
from crawlq.demo.run import prepare

LIMIT = 4
LEGACY_THREADS = 64


@dataclass(frozen=True, kw_only=True)
class Outcome:
    name: str
    seconds: float
    reports: int
    requests: int
    violations: int
    peak: int
    load: float  # the 1-minute load average when it started (other work shares the machine)


class Partners:
    """The demo sites and proxy in a child process (python -m crawlq.demo.serve)."""

    def __init__(self, reports: int, latency: float) -> None:
        self.process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "crawlq.demo.serve",
                "--reports",
                str(reports),
                "--latency",
                str(latency),
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        self.hello: dict[str, Any] = json.loads(self._stdout().readline())

    def _stdout(self) -> IO[str]:
        assert self.process.stdout is not None
        return self.process.stdout

    def command(self, line: str) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write(line + "\n")
        self.process.stdin.flush()
        answer = self._stdout().readline().strip()
        if answer != "ok":
            raise RuntimeError(f"demo sites answered {answer!r} to {line!r}")

    def log(self, path: Path) -> list[dict[str, Any]]:
        self.command(f"log {path}")
        with path.open() as lines:
            return [json.loads(line) for line in lines]

    def close(self) -> None:
        if self.process.stdin is not None:
            self.process.stdin.close()
        self.process.wait(timeout=60)


def violations(hits: list[dict[str, Any]]) -> tuple[int, int]:
    """(requests that arrived with LIMIT others of their host in flight, peak in flight)."""
    by_host: dict[str, list[tuple[float, float]]] = defaultdict(list)
    for hit in hits:
        by_host[hit["host"]].append((hit["at"], hit["ended"] or float("inf")))
    over = peak = 0
    for spans in by_host.values():
        events = sorted([(a, 1) for a, _ in spans] + [(e, -1) for _, e in spans])
        current = 0
        for _, change in events:
            current += change
            if change == 1 and current > LIMIT:
                over += 1
            peak = max(peak, current)
    return over, peak


async def run_crawlq(partners: Partners, data: Path, *, split: bool) -> float:
    """The demo's pipeline; with `split`, parse and normalize run in a worker process of
    their own (`crawlq worker crawlq.demo.app:app --queue parse --queue normalize`), as the
    stages are meant to be deployed, while this process fetches."""
    hello = partners.hello
    config = EtlConfig(
        data=data,
        sites=tuple(hello["sites"]),
        username=hello["username"],
        password=hello["password"],
        proxy=hello["proxy"],
        resolve=hello["resolve"],
        allow_networks=("127.0.0.0/8",),
    )
    etl = build(config)
    started = time.perf_counter()
    parsers: subprocess.Popen[bytes] | None = None
    try:
        from crawlq import Worker

        await etl.app.aschedule(etl.start, None)
        if not split:
            await Worker(etl.app, burst=True, concurrency=200, burst_horizon=10).run()
        else:
            command = [sys.executable, "-m", "crawlq", "worker", "crawlq.demo.app:app"]
            command += ["--queue", "parse", "--queue", "normalize", "-c", "16"]
            command += ["--log-level", "WARNING"]
            parsers = subprocess.Popen(command, env={**os.environ, "CRAWLQ_DEMO_DIR": str(data)})
            fetching = ["nightly", "listing", "download"]
            await Worker(
                etl.app, queues=fetching, burst=True, concurrency=200, burst_horizon=10
            ).run()
            backend = await etl.app.backend()
            while any(q.total for q in await backend.queue_stats(["parse", "normalize"])):
                await asyncio.sleep(0.1)  # the parse process finishes what is left
        etl.pipeline.run_finish()
    finally:
        if parsers is not None:
            parsers.terminate()
            parsers.wait()
        await etl.app.aclose()
        etl.pipeline.results.close()
    return time.perf_counter() - started


def run_legacy(partners: Partners, data: Path) -> float:
    """The usual first version: threads, a shared counter per domain, sleep while it is full."""
    hello = partners.hello
    proxy = urllib.request.ProxyHandler({"http": hello["proxy"]})
    openers = {
        site: urllib.request.build_opener(
            proxy, urllib.request.HTTPCookieProcessor(http.cookiejar.CookieJar())
        )
        for site in hello["sites"]
    }
    in_flight: dict[str, int] = defaultdict(int)  # shared per-domain counter
    db = sqlite3.connect(data / "legacy.sqlite", check_same_thread=False)
    db.execute("CREATE TABLE sales (key TEXT PRIMARY KEY, report, product, units, revenue_cents)")
    db_lock = threading.Lock()

    def get(site: str, url: str, form: dict[str, str] | None = None) -> tuple[int, str, str]:
        host = urllib.parse.urlsplit(url).hostname or ""
        while in_flight[host] >= LIMIT:  # wait for a free slot...
            time.sleep(0.01)
        in_flight[host] += 1  # ...then take it (not atomic: the usual bug)
        try:
            body = urllib.parse.urlencode(form).encode() if form else None
            for attempt in range(5):
                try:
                    with openers[site].open(url, data=body, timeout=60) as answer:
                        kind = answer.headers.get_content_type()
                        return answer.status, kind, answer.read().decode()
                except urllib.error.HTTPError as exc:
                    if exc.code < 500 or attempt == 4:
                        raise
                    time.sleep(0.2 * 2**attempt)
            raise AssertionError("unreachable")
        finally:
            in_flight[host] -= 1

    def reports_of(site: str) -> list[tuple[str, str]]:
        get(site, f"{site}/login", {"username": hello["username"], "password": hello["password"]})
        found, page = [], "/reports?page=0"
        while page:
            listing = json.loads(get(site, site + page)[2])
            found += [(site, site + path) for path in listing["reports"]]
            page = listing["next"]
        return found

    def process(job: tuple[str, str]) -> None:
        site, url = job
        _, kind, text = get(site, url)
        report = url.rsplit("/", 1)[1].split(".", 1)[0]
        sales = summarize(report, PARSERS[kind](text))
        rows = [
            (r.key, report, r.data["product"], r.data["units"], r.data["revenue_cents"])
            for r in sales
        ]
        with db_lock:
            db.executemany("INSERT OR REPLACE INTO sales VALUES (?, ?, ?, ?, ?)", rows)
            db.commit()

    started = time.perf_counter()
    with ThreadPoolExecutor(LEGACY_THREADS) as pool:
        jobs = [job for found in pool.map(reports_of, hello["sites"]) for job in found]
        list(pool.map(process, jobs))
    seconds = time.perf_counter() - started
    db.close()
    return seconds


def measure(reports: int, latency: float, runs: set[str]) -> Iterator[Outcome]:
    """The chosen `runs` (one: crawlq in 1 process, split: fetch + parse processes, legacy)."""
    with tempfile.TemporaryDirectory(prefix="etl-bench-") as scratch:
        root = Path(scratch)
        partners = Partners(reports, latency)
        try:
            for split in (False, True):
                if ("split" if split else "one") not in runs:
                    continue
                data = root / ("crawlq-split" if split else "crawlq")
                prepare(data)
                load = os.getloadavg()[0]
                seconds = asyncio.run(run_crawlq(partners, data, split=split))
                hits = partners.log(root / f"{data.name}-hits.jsonl")
                over, peak = violations(hits)
                yield Outcome(
                    name="crawlq, fetch + parse processes" if split else "crawlq, 1 process",
                    seconds=seconds,
                    reports=reports,
                    requests=len(hits),
                    violations=over,
                    peak=peak,
                    load=load,
                )
                partners.command("reset")
            if "legacy" not in runs:
                return
            load = os.getloadavg()[0]
            seconds = run_legacy(partners, root)
            hits = partners.log(root / "legacy-hits.jsonl")
            over, peak = violations(hits)
            yield Outcome(
                name=f"legacy ({LEGACY_THREADS} threads)",
                seconds=seconds,
                reports=reports,
                requests=len(hits),
                violations=over,
                peak=peak,
                load=load,
            )
        finally:
            partners.close()


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.etl_bench")
    parser.add_argument("--reports", type=int, default=20_000)
    parser.add_argument("--latency", type=float, default=0.05)
    parser.add_argument("--markdown", action="store_true", help="Print a BENCHMARKS.md section.")
    parser.add_argument(
        "--runs",
        default="one,split,legacy",
        help="Which ETLs to run, comma-separated (one, split, legacy); all by default.",
    )
    options = parser.parse_args()
    load = os.getloadavg()
    when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    runs = options.runs.split(",")
    outcomes = list(measure(options.reports, options.latency, set(runs)))
    lines = [
        f"Run `.venv/bin/python -m benchmarks.etl_bench --reports {options.reports}"
        f" --latency {options.latency}` on {when}; {platform.machine()}, Python"
        f" {platform.python_version()}, {os.cpu_count()} cores, load average before"
        f" {load[0]:.2f} / {load[1]:.2f} / {load[2]:.2f}.",
        "",
        "| ETL | wall time s | reports/s | requests | politeness violations | peak in flight"
        " | load at start |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for o in outcomes:
        lines.append(
            f"| {o.name} | {o.seconds:.1f} | {o.reports / o.seconds:,.0f} | {o.requests:,}"
            f" | {o.violations:,} | {o.peak} | {o.load:.1f} |"
        )
    crawlq_runs = [o for o in outcomes if o.name.startswith("crawlq")]
    legacy = [o for o in outcomes if o.name.startswith("legacy")]
    if crawlq_runs and legacy:
        crawlq_run = min(crawlq_runs, key=lambda o: o.seconds)
        ratio = legacy[0].seconds / crawlq_run.seconds
        met = ratio >= 4 and all(o.violations == 0 for o in crawlq_runs)
        lines += [
            "",
            f"crawlq ({crawlq_run.name}) is {ratio:.1f}x faster with {crawlq_run.violations}"
            " violations; target"
            f" (at least 4x, zero violations): {'met' if met else 'NOT met'}.",
        ]
    if options.markdown:
        print("\n".join(lines))
    else:
        Console().print("\n".join(lines))


if __name__ == "__main__":
    main()
