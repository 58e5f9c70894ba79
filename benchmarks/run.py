"""Every benchmark in one run on one machine: crawlq, then the peers on a local redis-server.

    bash scripts/bench.sh            # sets up the bench extra and redis-server, then runs this
    python -m benchmarks.run [--big N] [--write BENCHMARKS.md] [--json results.json]

Writes the tables of BENCHMARKS.md between its markers, with ratios computed in this run.
"""

from __future__ import annotations

import argparse
import datetime
import json
import platform
import sys
from pathlib import Path
from typing import Any

from benchmarks import crawlq_bench
from benchmarks.peers import NAMES, Workload
from benchmarks.peers.run import IO_TASKS, NOOP_TASKS, run_peer
from crawlq.testing.redis_server import redis_server

BEGIN, END = "<!-- results:begin -->", "<!-- results:end -->"
COMMAND = "bash scripts/bench.sh"


def run_peers(noop_tasks: int) -> list[dict[str, Any]]:
    results = []
    with redis_server() as url:
        for peer in NAMES:
            workloads: tuple[tuple[Workload, int], ...] = (("noop", noop_tasks), ("io", IO_TASKS))
            for workload, tasks in workloads:
                for processes in (1, 2):
                    print(f"{peer}: {workload} x{processes} ...", file=sys.stderr, flush=True)
                    try:
                        results.append(run_peer(peer, workload, processes, tasks, url))
                    except Exception as exc:  # a peer that fails is reported, not fatal
                        results.append(
                            {
                                "system": peer,
                                "workload": workload,
                                "processes": processes,
                                "error": f"{type(exc).__name__}: {str(exc)[:300]}",
                            }
                        )
    return results


def _config(r: dict[str, Any]) -> str:
    config = r.get("config", r.get("error", ""))
    if isinstance(config, dict):
        return "; ".join(f"{k}: {v}" for k, v in config.items())
    return str(config)


def _rate(r: dict[str, Any]) -> str:
    return "failed" if "error" in r else f"{r['rate']:,.0f}"


def drain_table(results: list[dict[str, Any]]) -> str:
    rows = [
        "| workload | processes | system | tasks/s | x crawlq | peak RSS MB | configuration |",
        "|---|---|---|---|---|---|---|",
    ]
    for workload in ("noop", "io"):
        for processes in (1, 2):
            same = [
                r
                for r in results
                if r.get("workload") == workload and r.get("processes") == processes
            ]
            ours = next((r for r in same if r["system"] == "crawlq" and not r.get("memory")), None)
            same.sort(key=lambda r: -r.get("rate", 0))
            for r in same:
                if r["system"] == "crawlq" and r is not ours:
                    continue
                ratio = ""
                if ours and "error" not in r and r is not ours:
                    ratio = f"{ours['rate'] / r['rate']:.1f}x"
                rss = r.get("peak_rss_mb")
                rows.append(
                    f"| {workload} | {processes} | {r['system']} {r.get('version', '')} | "
                    f"{_rate(r)} | {ratio} | {'' if rss is None else f'{rss:.0f}'} | "
                    f"{_config(r)} |"
                )
    return "\n".join(rows)


def crawlq_table(results: list[dict[str, Any]]) -> str:
    rows = ["| measure | result |", "|---|---|"]
    by = {r["workload"]: r for r in results if r["system"] == "crawlq"}
    for name in ("schedule-single", "schedule-bulk", "schedule-bulk-plain"):
        if name in by:
            rows.append(f"| {name} ({by[name]['config']}) | {by[name]['rate']:,.0f} elements/s |")
    claims = [r for r in results if r["workload"] == "claim"]
    for r in claims:
        rows.append(
            f"| claim, {r['queued']:,} queued in {r['groups']:,} groups, "
            f"{r['blocked_groups']:,} blocked ({r['config']}) | {r['rate']:,.0f} claims/s |"
        )
    for per_claim in sorted({r["per_claim"] for r in claims}):
        small, *_, big = sorted(
            (r for r in claims if r["per_claim"] == per_claim), key=lambda r: r["queued"]
        )
        rows.append(
            f"| claim rate at {big['queued']:,} / at {small['queued']:,}, {per_claim} a claim |"
            f" {big['rate'] / small['rate']:.0%} |"
        )
    memory = [r for r in results if r.get("memory")]
    for r in memory:
        rows.append(
            f"| worker peak RSS draining {r['tasks']:,} of {r['queued']:,} queued | "
            f"{r['peak_rss_mb']:.0f} MB |"
        )
    return "\n".join(rows)


def render(results: list[dict[str, Any]], when: datetime.datetime) -> str:
    return "\n".join(
        [
            BEGIN,
            f"Run `{COMMAND}` on {when:%Y-%m-%d %H:%M} UTC; "
            f"{platform.node()}, {platform.machine()}, "
            f"Python {platform.python_version()}, 2 cores. All systems measured in this run, "
            f"same machine; crawlq on its embedded SQLite file, the peers on one local "
            f"redis-server. Rates count completions between the first and the last, so worker "
            f"start-up is left out (benchmarks/common.py).",
            "",
            "### crawlq alone",
            "",
            crawlq_table(results),
            "",
            f"### Drain: {NOOP_TASKS:,} no-op tasks, and {IO_TASKS:,} tasks sleeping 50 ms",
            "",
            "`x crawlq` is crawlq's rate divided by that system's rate.",
            "",
            drain_table(results),
            END,
        ]
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--big", type=int, default=1_000_000)
    parser.add_argument("--write", type=Path, help="replace the results in this markdown file")
    parser.add_argument("--json", type=Path, help="also write every result record here")
    parser.add_argument("--skip-peers", action="store_true")
    parser.add_argument("--from-json", type=Path, help="render saved records, run nothing")
    args = parser.parse_args(argv)
    when = datetime.datetime.now(datetime.UTC)
    if args.from_json:
        results = json.loads(args.from_json.read_text())
        when = datetime.datetime.fromtimestamp(args.from_json.stat().st_mtime, datetime.UTC)
    else:
        results = crawlq_bench.main(["--big", str(args.big)])
        if not args.skip_peers:
            results += run_peers(NOOP_TASKS)
    text = render(results, when)
    print(text)
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))
    if args.write:
        page = args.write.read_text() if args.write.exists() else f"{BEGIN}\n{END}\n"
        head, _, rest = page.partition(BEGIN)
        _, _, tail = rest.partition(END)
        args.write.write_text(head + text + tail)


if __name__ == "__main__":
    main()
