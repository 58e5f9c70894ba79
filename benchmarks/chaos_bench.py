"""Chaos and backend faults at full size (issue 7, items 1 and 2), printed as markdown tables.

    python -m benchmarks.chaos_bench [--only worker,redis,sqlite,disk] [--json FILE] [--small]

- worker: a 10,000-page crawl (100 sites x 100 pages, 20 ms per page) by 3 `crawlq crawl`
  processes sharing one backend, on SQLite and on Redis: 20 SIGKILLs (each followed by a
  replacement) and 2 SIGSTOPs for 5 s against a 3 s lease, at points set by the pages the
  server has seen. One request at a time per site, without and with a 0.1 s interval; the
  interval run also without chaos, as the baseline its violations compare with.
  And the overlap leases cannot prevent: a worker frozen (SIGSTOP) past its lease while
  its request is still open at the server (a 5 s answer, a 2 s lease).
- redis: the same crawl on Redis with an append-only file (`appendfsync always`, then
  `everysec`), redis-server SIGKILLed and restarted 5 times, 2 probe writers beside it
  journaling every acknowledged schedule and ack.
- sqlite: a writer (schedule, claim, ack, fail in a loop) SIGKILLed 500 times at random points.
- disk: the queue on a 2 MB tmpfs, half of it ballast, filled until refused (needs root to
  mount it).

Everything stays on loopback; `tests/chaos/` runs the same at CI size.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import os
import platform
import subprocess
import tempfile
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from crawlq.testing.chaos import (
    ChaosPlan,
    ChaosResult,
    SyntheticWebThread,
    chaos_sites,
    frozen_mid_request,
    run_worker_chaos,
)
from crawlq.testing.faults import (
    CrashReport,
    Probes,
    crash_redis,
    fill_disk,
    finish_probes,
    kill_writers,
    small_disk,
)
from crawlq.testing.redis_server import RedisServer

PARTS = ("worker", "redis", "sqlite", "disk")


@dataclass(frozen=True, kw_only=True)
class Size:
    sites: int = 100
    pages: int = 100
    kills: int = 20
    stops: int = 2
    crashes: int = 5
    writer_kills: int = 500


#: How many of the shortest interval gaps each run lists, with the requests involved.
SHORTEST = 5

SMALL = Size(sites=20, pages=50, kills=5, stops=1, crashes=2, writer_kills=100)


# -- worker chaos ---------------------------------------------------------------------------


def backend_for(kind: str, work: Path, stack: list[Callable[[], None]]) -> str:
    if kind == "sqlite":
        return f"sqlite:///{work / 'queue.db'}"
    server = RedisServer(appendonly=True)
    stack.append(server.remove)
    return server.start()


def crawl(kind: str, plan: ChaosPlan, size: Size, work: Path) -> dict[str, Any]:
    cleanup: list[Callable[[], None]] = []
    try:
        url = backend_for(kind, work, cleanup)
        with SyntheticWebThread(chaos_sites(size.sites, size.pages, latency=0.02)) as web:
            return summary(run_worker_chaos(web, plan, url, work))
    finally:
        for step in cleanup:
            step()


def summary(result: ChaosResult) -> dict[str, Any]:
    v = result.verdict
    return {
        "pages": v.pages,
        "expected": v.expected,
        "requests": v.requests,
        "duplicates": v.duplicates,
        "held": result.held,
        "kills": result.kills,
        "stops": result.stops,
        "concurrency": v.count("concurrency"),
        "interval": v.count("interval"),
        "interval_robots": v.count("interval", robots=True),
        "min_gap": v.min_gap,
        # Each concurrency violation with the requests it overlapped (path, arrival and
        # answer, the worker's pid), and the shortest interval gaps likewise.
        "concurrency_detail": v.explain("concurrency"),
        "interval_shortest": v.explain("interval", SHORTEST),
        "lapsed": result.lapsed,
        "problems": result.problems,
        "process_failures": result.process_failures,
        "seconds": result.seconds,
    }


def worker_chaos(size: Size, scratch: Path) -> list[dict[str, Any]]:
    chaos = {"kills": size.kills, "stops": size.stops}
    runs = [
        ("one at a time", ChaosPlan(concurrency=1, delay=0.0, **chaos)),
        ("+ 0.1 s interval, no chaos", ChaosPlan(concurrency=1, delay=0.1, kills=0, stops=0)),
        ("+ 0.1 s interval", ChaosPlan(concurrency=1, delay=0.1, **chaos)),
    ]
    rows: list[dict[str, Any]] = []
    for kind in ("sqlite", "redis"):
        for name, plan in runs:
            work = scratch / f"worker-{kind}-{len(rows)}"
            work.mkdir()
            row = crawl(kind, plan, size, work)
            row.update(backend=kind, config=name, delay=plan.delay)
            print(json.dumps(row), flush=True)
            rows.append(row)
    return rows


def violations_detail(rows: list[dict[str, Any]]) -> str:
    """Every concurrency violation of the worker-chaos runs and their shortest interval
    gaps, each with the requests involved (times in seconds from the run's first request)."""
    lines = []
    for r in rows:
        where = f"{r['backend']}, {r['config']}"
        lines += [f"- {where}: {line}" for line in r["concurrency_detail"]]
        lines += [f"- {where}, shortest gap: {line}" for line in r["interval_shortest"]]
    return "\n".join(lines) or "none"


def _check(row: dict[str, Any]) -> str:
    return "ok" if not row["problems"] else f"**{len(row['problems'])} problems**"


def worker_table(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| backend | run | pages fetched | kills / stops | fetched twice (bound: held by"
        " victims) | concurrency violations | interval violations (robots.txt) | leases"
        " dropped on resume | check, slots left | wall s |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        interval = "-" if not r["delay"] else f"{r['interval']} ({r['interval_robots']})"
        lines.append(
            f"| {r['backend']} | {r['config']} | {r['pages']:,}/{r['expected']:,}"
            f" | {r['kills']} / {r['stops']} | {r['duplicates']} ({r['held']})"
            f" | {r['concurrency']} | {interval} | {r['lapsed']} | {_check(r)}"
            f" | {r['seconds']:.0f} |"
        )
    return "\n".join(lines)


# -- Redis crashes --------------------------------------------------------------------------


def frozen(scratch: Path) -> list[dict[str, Any]]:
    """The overlap leases cannot prevent, once per backend."""
    rows = []
    for kind in ("sqlite", "redis"):
        work = scratch / f"frozen-{kind}"
        work.mkdir()
        cleanup: list[Callable[[], None]] = []
        try:
            verdict = frozen_mid_request(backend_for(kind, work, cleanup), work)
        finally:
            for step in cleanup:
                step()
        row = {
            "backend": kind,
            "pages": verdict.pages,
            "expected": verdict.expected,
            "duplicates": verdict.duplicates,
            "concurrency": verdict.explain("concurrency"),
        }
        print(json.dumps(row), flush=True)
        rows.append(row)
    return rows


def frozen_table(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| backend | pages fetched | fetched twice | concurrency violations |",
        "|---|---|---|---|",
    ]
    for r in rows:
        found = "<br>".join(r["concurrency"]) or "none"
        lines.append(
            f"| {r['backend']} | {r['pages']}/{r['expected']} | {r['duplicates']}"
            f" | {len(r['concurrency'])}: {found} |"
        )
    return "\n".join(lines)


def redis_crashes(size: Size, scratch: Path) -> list[dict[str, Any]]:
    rows = []
    total = size.sites * size.pages
    for mode in ("always", "everysec"):
        work = scratch / f"redis-{mode}"
        work.mkdir()
        server = RedisServer(appendonly=True, appendfsync=mode)
        url = server.start()
        report = CrashReport()
        probes = Probes(f"{url}?namespace=probes", work)
        try:
            crash = functools.partial(crash_redis, server, probes, report)
            points = [int(total * (n + 1) / (size.crashes + 2)) for n in range(size.crashes)]
            with SyntheticWebThread(chaos_sites(size.sites, size.pages, latency=0.02)) as web:
                plan = ChaosPlan(concurrency=1, kills=0, stops=0, lease=10.0)
                result = run_worker_chaos(web, plan, url, work, faults=[(p, crash) for p in points])
            finish_probes(probes, report)
        finally:
            probes.close()
            server.remove()
        row = summary(result)
        row.update(
            appendfsync=mode,
            crashes=report.crashes,
            down=report.down,
            probe_scheduled=report.scheduled,
            probe_acked=report.acked,
            lost_schedules=len(report.lost_schedules),
            undone_acks=len(report.revived),
            stale_acks=len(report.stale),
        )
        print(json.dumps(row), flush=True)
        rows.append(row)
    return rows


def redis_table(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| appendfsync | SIGKILLs of redis-server | down s (sum) | probe schedules acknowledged"
        " | lost | probe acks acknowledged | undone (refused as stale) | crawl pages fetched"
        " | never fetched | fetched twice | concurrency violations | check |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['appendfsync']} | {r['crashes']} | {r['down']:.2f}"
            f" | {r['probe_scheduled']:,} | {r['lost_schedules']} | {r['probe_acked']:,}"
            f" | {r['undone_acks']} ({r['stale_acks']}) | {r['pages']:,}/{r['expected']:,}"
            f" | {r['expected'] - r['pages']} | {r['duplicates']} | {r['concurrency']}"
            f" | {_check(r)} |"
        )
    return "\n".join(lines)


# -- SQLite writers killed, a full disk -----------------------------------------------------


def sqlite_kills(size: Size, scratch: Path) -> dict[str, Any]:
    work = scratch / "sqlite-kills"
    work.mkdir()
    report = kill_writers(f"sqlite:///{work / 'queue.db'}", work, kills=size.writer_kills)
    row = {
        "kills": report.kills,
        "inside_calls": report.inside_calls,
        "scheduled": report.journal.scheduled,
        "acked": report.journal.acked,
        "lost_schedules": len(report.journal.lost_schedules),
        "undone_acks": len(report.journal.revived),
        "stale_acks": len(report.journal.stale),
        "corrupt": report.corrupt,
        "problems": report.problems,
        "seconds": report.seconds,
    }
    print(json.dumps(row), flush=True)
    return row


def sqlite_table(r: dict[str, Any]) -> str:
    return "\n".join(
        [
            "| SIGKILLs | inside a backend call | schedules acknowledged | lost | acks"
            " acknowledged | undone (refused as stale) | integrity_check not ok | check()"
            " problems | s |",
            "|---|---|---|---|---|---|---|---|---|",
            f"| {r['kills']} | {r['inside_calls']} | {r['scheduled']:,} | {r['lost_schedules']}"
            f" | {r['acked']:,} | {r['undone_acks']} ({r['stale_acks']}) | {len(r['corrupt'])}"
            f" | {len(r['problems'])} | {r['seconds']:.1f} |",
        ]
    )


def full_disk(scratch: Path) -> dict[str, Any]:
    with small_disk(scratch / "disk") as folder:
        report = asdict(asyncio.run(fill_disk(folder)))
    print(json.dumps(report), flush=True)
    return report


def disk_table(r: dict[str, Any]) -> str:
    cli = r["cli_stderr"].strip()
    return "\n".join(
        [
            "| on a 2 MB tmpfs, 1 MB of it ballast | result |",
            "|---|---|",
            f"| elements scheduled until refused | {r['added']:,} (all {r['total']:,} still"
            " queued) |",
            f"| the refusal | `{r['errors'][-1] if r['errors'] else '-'}` |",
            f"| `crawlq schedule` | exit {r['cli_code']}, one line: `{cli}` |",
            f"| integrity_check / check() on the full disk | {', '.join(r['integrity'])} /"
            f" {len(r['problems'])} problems |",
            f"| space freed: scheduled, claimed and acked | {r['added_after']},"
            f" {r['claimed_after']}; check() {len(r['problems_after'])} problems,"
            f" integrity_check {', '.join(r['integrity_after'])} |",
        ]
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--only", default=",".join(PARTS), help="parts, comma-separated")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    parser.add_argument("--small", action="store_true", help="CI size, for a quick try")
    parser.add_argument("--keep", type=Path, help="keep logs and data in this new folder")
    options = parser.parse_args(argv)
    size = SMALL if options.small else Size()
    parts = options.only.split(",")
    load = subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
    results: dict[str, Any] = {"load_before": load, "size": asdict(size)}
    sections = []
    with tempfile.TemporaryDirectory(prefix="chaosbench-") as temporary:
        scratch = options.keep or Path(temporary)
        scratch.mkdir(parents=True, exist_ok=True)
        if "worker" in parts:
            results["worker"] = worker_chaos(size, scratch)
            sections.append(("Worker chaos", worker_table(results["worker"])))
            sections.append(
                (
                    "Worker chaos: the violations, with the requests involved",
                    violations_detail(results["worker"]),
                )
            )
            results["frozen"] = frozen(scratch)
            sections.append(
                (
                    "A worker frozen past its lease while its request is open (5 s answer,"
                    " 2 s lease)",
                    frozen_table(results["frozen"]),
                )
            )
        if "redis" in parts:
            results["redis"] = redis_crashes(size, scratch)
            sections.append(("redis-server SIGKILLed mid-crawl", redis_table(results["redis"])))
        if "sqlite" in parts:
            results["sqlite"] = sqlite_kills(size, scratch)
            sections.append(("SQLite writer SIGKILLed", sqlite_table(results["sqlite"])))
        if "disk" in parts:
            results["disk"] = full_disk(scratch)
            sections.append(("A full disk under SQLite", disk_table(results["disk"])))
    print(
        f"\nRun on {platform.machine()}, {os.cpu_count()} CPUs, Python"
        f" {platform.python_version()}; load before: `{load}`\n"
    )
    for title, table in sections:
        print(f"### {title}\n\n{table}\n")
    if options.json:
        options.json.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
