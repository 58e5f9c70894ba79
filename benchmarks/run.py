"""Every benchmark in one run on one machine: crawlq on SQLite, then crawlq on Redis and the
peers, all on one local redis-server (benchmarks.redis_compare).

    bash scripts/bench.sh            # sets up the bench extra and redis-server, then runs this
    python -m benchmarks.run [--big N] [--write BENCHMARKS.md] [--json results.json]
        [--skip-peers] [--skip-redis] [--from-json results.json]

Writes the tables of BENCHMARKS.md between its markers, with ratios computed in this run.
"""

from __future__ import annotations

import argparse
import datetime
import json
import platform
from pathlib import Path
from typing import Any

from benchmarks import crawlq_bench, redis_compare, redis_floor
from benchmarks.peers import NAMES
from benchmarks.peers.run import IO_TASKS, NOOP_TASKS
from crawlq.testing.redis_server import redis_server

BEGIN, END = "<!-- results:begin -->", "<!-- results:end -->"
COMMAND = "bash scripts/bench.sh"


def run_redis(big: int, peers: bool) -> list[dict[str, Any]]:
    """crawlq on Redis and (unless ``peers`` is false) every peer, on one redis-server."""
    systems = redis_compare.SYSTEMS if peers else ("crawlq",)
    with redis_server() as url:
        results = redis_compare.run_all(url, systems=systems, big=big)
        if peers:
            results += redis_floor.measure(url)
        return results


def is_sqlite(r: dict[str, Any]) -> bool:
    """crawlq's SQLite records (older runs' records say no backend: they were all SQLite)."""
    return r.get("system") == "crawlq" and r.get("backend", "sqlite") == "sqlite"


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
                if r.get("workload") == workload
                and r.get("processes") == processes
                and (r.get("system") != "crawlq" or is_sqlite(r))
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
    results = [r for r in results if is_sqlite(r)]
    rows = ["| measure | result |", "|---|---|"]
    by = {r["workload"]: r for r in results}
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


# -- crawlq on Redis against the peers ------------------------------------------------------

#: (label, unit, pick, higher is better, target): pick finds a system's figure in the records.
Pick = Any


def _find(results: list[dict[str, Any]], system: str, **match: Any) -> dict[str, Any] | None:
    for r in results:
        if r.get("suite") != "redis" or r.get("system") != system:
            continue
        if all(r.get(k) == v for k, v in match.items()):
            return r
    return None


def _figure(r: dict[str, Any] | None, field: str) -> float | None:
    if r is None or "error" in r or field not in r:
        return None
    return float(r[field])


def _rows(big: int) -> list[tuple[str, str, dict[str, Any], bool, str, float | None]]:
    """(label, field, match, higher is better, target kind, target factor)."""
    rows: list[tuple[str, str, dict[str, Any], bool, str, float | None]] = [
        ("schedule, one a call (/s)", "rate", {"workload": "schedule-single"}, True, "ahead", 1),
        ("schedule, bulk (/s)", "rate", {"workload": "schedule-bulk"}, True, "ahead", 1),
    ]
    for workload, name in (("noop", "no-op"), ("io", "I/O 50 ms")):
        for processes in (1, 2):
            rows.append(
                (
                    f"{name} drain, {processes} process{'es' if processes > 1 else ''} (/s)",
                    "rate",
                    {"workload": workload, "processes": processes},
                    True,
                    "ahead",
                    3,
                )
            )
    rows += [
        ("lateness p50 (ms)", "p50_ms", {"workload": "lateness"}, False, "", None),
        ("lateness p99 (ms)", "p99_ms", {"workload": "lateness"}, False, "under", 20),
        (
            "bytes per queued element",
            "bytes_per_element",
            {"workload": "memory"},
            False,
            "half",
            0.5,
        ),
    ]
    return rows


def _claim(results: list[dict[str, Any]], system: str, queued: int) -> dict[str, Any] | None:
    if system == "crawlq":
        return _find(results, system, workload="claim", queued=queued, per_claim=1)
    return _find(results, system, workload="dequeue", queued=queued)


def _fmt(value: float | None, field: str) -> str:
    if value is None:
        return "failed"
    if field.endswith("_ms"):
        return f"{value:,.1f}"
    return f"{value:,.0f}"


def redis_table(results: list[dict[str, Any]]) -> str:
    systems = ["crawlq", *NAMES]
    versions: dict[str, str] = {}
    for r in results:
        if r.get("suite") == "redis" and "version" in r:
            versions.setdefault(r["system"], r["version"])
    head = " | ".join(f"{s} {versions.get(s, '')}".strip() for s in systems)
    rows = [
        f"| measure | {head} | best peer | crawlq vs best peer | target | met |",
        "|---" * (len(systems) + 5) + "|",
    ]
    claims = [
        r
        for r in results
        if r.get("suite") == "redis" and r.get("workload") in ("claim", "dequeue")
    ]
    sizes = sorted({r["queued"] for r in claims})
    specs = _rows(sizes[-1] if sizes else 0)
    for queued in sizes:
        specs.append(
            (
                f"claim (crawlq) / dequeue (peers) at {queued:,} queued (/s)",
                "rate",
                {"queued": queued},
                True,
                "ahead",
                1,
            )
        )
    for label, field, match, higher, kind, factor in specs:
        found = {
            s: (
                _claim(results, s, match["queued"])
                if "queued" in match
                else _find(results, s, **match)
            )
            for s in systems
        }
        values = {s: _figure(r, field) for s, r in found.items()}
        if all(v is None for v in values.values()):
            continue
        peers = {s: v for s, v in values.items() if s != "crawlq" and v is not None}
        ours = values["crawlq"]
        best_name = ""
        best: float | None = None
        if peers:
            best_name = (max if higher else min)(peers, key=lambda s: peers[s])
            best = peers[best_name]
        ratio, target, met = "", "", ""
        if ours is not None and best:
            ratio = f"{ours / best:.2f}x"
        if kind == "ahead":
            target = f"at least {factor}x best peer" if factor != 1 else "ahead of every peer"
            if ours is not None and best is not None:
                met = "yes" if ours >= (factor or 1) * best and ours > best else "**no**"
        elif kind == "under":
            target = f"under {factor} ms"
            if ours is not None and factor is not None:
                met = "yes" if ours < factor else "**no**"
        elif kind == "half":
            target = "at most half the leanest peer"
            if ours is not None and best is not None and factor is not None:
                met = "yes" if ours <= factor * best else "**no**"
        cells = " | ".join(_fmt(values[s], field) for s in systems)
        best_cell = "" if best is None else f"{best_name} {_fmt(best, field)}"
        rows.append(f"| {label} | {cells} | {best_cell} | {ratio} | {target} | {met} |")
    if len(sizes) >= 2:
        small, big = sizes[0], sizes[-1]
        shares: list[float | None] = []
        for s in systems:
            a = _figure(_claim(results, s, small), "rate")
            b = _figure(_claim(results, s, big), "rate")
            shares.append(None if a is None or b is None else b / a)
        shares_cells = " | ".join("" if x is None else f"{x:.0%}" for x in shares)
        met = "" if shares[0] is None else ("yes" if shares[0] >= 0.8 else "**no**")
        rows.append(
            f"| rate at {big:,} / at {small:,} queued | {shares_cells} | | | "
            f"crawlq at least 80% | {met} |"
        )
        batched = [
            _find(results, "crawlq", workload="claim", queued=q, per_claim=100) for q in sizes
        ]
        if all(r is not None and "error" not in r for r in batched):
            first, last = batched[0], batched[-1]
            assert first is not None and last is not None
            rate_a, rate_b = first["rate"], last["rate"]
            rows.append(
                f"| crawlq claim, 100 a claim, at {small:,} / {big:,} queued (/s) | "
                f"{rate_a:,.0f} / {rate_b:,.0f} ({rate_b / rate_a:.0%}) |"
                + " |"
                * (len(systems) + 3)
            )
    return "\n".join(rows)


def redis_configs(results: list[dict[str, Any]]) -> str:
    rows = ["| measure | system | how it was run |", "|---|---|---|"]
    order = ["schedule-single", "schedule-bulk", "memory", "noop", "io", "lateness"]
    order += ["claim", "dequeue"]
    redis = [r for r in results if r.get("suite") == "redis"]
    for workload in order:
        for system in ["crawlq", *NAMES]:
            seen: set[str] = set()
            if workload in ("noop", "io") and system != "crawlq":
                continue  # the peers' drain configurations are in the drain table above
            for r in redis:
                if r.get("workload") != workload or r.get("system") != system:
                    continue
                text = _config(r)
                if "processes" in r and "error" not in r:
                    text = f"{r['processes']} process(es): {text}"
                if "queued" in r and workload == "dequeue":
                    text = f"{r['queued']:,} queued, filled in {r['fill_seconds']:.1f} s: {text}"
                if text in seen:
                    continue
                seen.add(text)
                rows.append(f"| {workload} | {system} | {text} |")
    return "\n".join(rows)


def redis_section(results: list[dict[str, Any]]) -> list[str]:
    if not any(r.get("suite") == "redis" for r in results):
        return []
    rc = redis_compare
    return [
        "",
        "### crawlq on Redis against the peers, all on one redis-server",
        "",
        "Measured in the same run, one system at a time on the same redis-server, flushed "
        "before each measure (benchmarks/redis_compare.py). `crawlq vs best peer` is crawlq's "
        "figure divided by the best peer's (for lateness and bytes, lower is better). "
        f"Schedule: {rc.SINGLES:,} one-call enqueues, then {rc.MEMORY_ELEMENTS:,} "
        "URLs (~60 characters, the same strings for every system) by the bulk path; bytes per "
        "element are INFO memory used_memory, once the client disconnected (its connection's "
        "buffers are not storage), minus before that bulk enqueue. Lateness: "
        f"{rc.LATE_TASKS:,} delayed tasks enqueued one at a time at "
        f"{rc.LATE_PACE:,.0f}/s, each due {rc.LATE_DELAY:g} s after its enqueue, "
        "one worker process; the task records its start minus its due time. Claim: crawlq's "
        "claim with 10,000 groups of which 9,000 are blocked; the peers' dequeue has no "
        "groups or politeness at all, so those rows compare raw queue speed only.",
        "",
        redis_table(results),
        "",
        "How each system was run:",
        "",
        redis_configs(results),
        *floor_section(results),
    ]


def floor_section(results: list[dict[str, Any]]) -> list[str]:
    table = redis_floor.table(results)
    if not table:
        return []
    return [
        "",
        "### Single calls: what crawlq's client costs alone",
        "",
        "benchmarks/redis_floor.py: crawlq's single schedule and single claim (one element a "
        "claim, from 100,000 elements in the claim queue's 10,000 groups, 9,000 blocked), as "
        "they are and with the operation's Redis function swapped for one that does no work "
        "and returns a reply of the same shape, "
        "against Huey's enqueue (one LPUSH) and dequeue (one RPOP), and crawlq's schedule "
        "from plain synchronous code as Huey's is (`app.schedule`); "
        f"{redis_floor.ROUNDS} rounds of {redis_floor.CALLS:,} calls, the variants taking "
        "turns, medians. With the server's work gone, what is left is the client's: the event "
        "loop's round trip, the API, packing and parsing.",
        "",
        table,
    ]


def render(results: list[dict[str, Any]], when: datetime.datetime) -> str:
    return "\n".join(
        [
            BEGIN,
            f"Run `{COMMAND}` on {when:%Y-%m-%d %H:%M} UTC; "
            f"{platform.node()}, {platform.machine()}, "
            f"Python {platform.python_version()}, 2 cores. All systems measured in this run, "
            f"same machine; crawlq on its embedded SQLite file, then crawlq on Redis and the "
            f"peers on one local redis-server. Rates count completions between the first and "
            f"the last, so worker start-up is left out (benchmarks/common.py).",
            "",
            "### crawlq alone, on SQLite",
            "",
            crawlq_table(results),
            "",
            f"### Drain: {NOOP_TASKS:,} no-op tasks, and {IO_TASKS:,} tasks sleeping 50 ms",
            "",
            "crawlq on SQLite against the peers on Redis. "
            "`x crawlq` is crawlq's rate divided by that system's rate.",
            "",
            drain_table(results),
            *redis_section(results),
            END,
        ]
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--big", type=int, default=1_000_000)
    parser.add_argument("--write", type=Path, help="replace the results in this markdown file")
    parser.add_argument("--json", type=Path, help="also write every result record here")
    parser.add_argument("--skip-peers", action="store_true", help="crawlq alone on Redis")
    parser.add_argument("--skip-redis", action="store_true", help="crawlq on SQLite only")
    parser.add_argument("--from-json", type=Path, help="render saved records, run nothing")
    args = parser.parse_args(argv)
    when = datetime.datetime.now(datetime.UTC)
    if args.from_json:
        results = json.loads(args.from_json.read_text())
        when = datetime.datetime.fromtimestamp(args.from_json.stat().st_mtime, datetime.UTC)
    else:
        results = crawlq_bench.main(["--big", str(args.big)])
        if not args.skip_redis:
            results += run_redis(args.big, peers=not args.skip_peers)
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
