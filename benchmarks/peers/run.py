"""Benchmark the peer task queues on a private local redis-server.

    python -m benchmarks.peers.run [--peer NAME|all] [--workload noop|io|all]
        [--processes 1 2] [--tasks N] [--json OUT] [--redis-url URL]

For each combination: flush Redis, enqueue every task, start the workers, wait for
all completions (benchmarks.common), stop the workers, record the result.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import signal
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import redis

from benchmarks.common import MARKER_ENV, PeakRSS, run_workers, wait_for_completions
from benchmarks.peers import NAMES, URL_ENV, WORKLOADS, Peer, Workload
from crawlq.testing.redis_server import redis_server

REPO_ROOT = Path(__file__).resolve().parents[2]
NOOP_TASKS = 20_000
IO_TASKS = 2_000
RUN_TIMEOUT = 120.0


def load_peer(name: str) -> Peer:
    module = importlib.import_module(f"benchmarks.peers.{name}_peer")
    peer = module.PEER
    if not isinstance(peer, Peer):
        raise TypeError(f"benchmarks.peers.{name}_peer.PEER is not a Peer")
    return peer


def _worker_env(redis_url: str, marker: Path) -> dict[str, str]:
    env = dict(os.environ)
    path = [str(REPO_ROOT), *filter(None, [env.get("PYTHONPATH")])]
    env.update({URL_ENV: redis_url, MARKER_ENV: str(marker), "PYTHONPATH": os.pathsep.join(path)})
    return env


def _flush(redis_url: str) -> None:
    client = redis.Redis.from_url(redis_url, socket_timeout=10)
    try:
        client.flushall()
    finally:
        client.close()


def run_peer(
    peer: str,
    workload: Workload,
    processes: int,
    tasks: int,
    redis_url: str,
    timeout: float = RUN_TIMEOUT,
) -> dict[str, Any]:
    """Run one combination; return its result record. Workers are always stopped."""
    spec = load_peer(peer)
    _flush(redis_url)
    with tempfile.TemporaryDirectory(prefix=f"bench-{peer}-") as tmp:
        marker = Path(tmp) / "done"
        marker.touch()
        started = time.perf_counter()
        spec.enqueue(redis_url, workload, tasks)
        enqueue_seconds = time.perf_counter() - started
        commands = spec.worker_commands(redis_url, workload, processes)
        env = _worker_env(redis_url, marker)
        with ExitStack() as stack:
            workers = stack.enter_context(
                run_workers(commands, env, Path(tmp) / "workers.log", cwd=REPO_ROOT)
            )
            rss = stack.enter_context(PeakRSS([p.pid for p in workers.procs]))
            measured = wait_for_completions(marker, tasks, timeout, check=workers.check_alive)
        extra = marker.stat().st_size - tasks
    if extra > 0:
        print(f"warning: {peer}/{workload}: {extra} tasks ran more than once", file=sys.stderr)
    return {
        "system": spec.name,
        "version": spec.version,
        "workload": workload,
        "processes": processes,
        "tasks": tasks,
        "enqueue_seconds": round(enqueue_seconds, 3),
        "seconds": round(measured.seconds, 3),
        "rate": round(measured.rate, 1),
        "peak_rss_mb": None if rss.peak_mb is None else round(rss.peak_mb, 1),
        "config": spec.config(workload, processes),
    }


def format_table(records: Sequence[dict[str, Any]]) -> str:
    head = f"{'system':<9} {'version':<8} {'workload':<8} {'procs':>5} {'tasks':>6}"
    head += f" {'enqueue_s':>9} {'seconds':>8} {'rate/s':>9} {'rss_mb':>7}"
    lines = [head]
    for r in records:
        line = f"{r['system']:<9} {r.get('version', ''):<8} {r['workload']:<8}"
        line += f" {r['processes']:>5} {r['tasks']:>6}"
        if "error" in r:
            lines.append(f"{line}  ERROR: {r['error'].splitlines()[0][:80]}")
            continue
        rss = "-" if r["peak_rss_mb"] is None else f"{r['peak_rss_mb']:.0f}"
        line += f" {r['enqueue_seconds']:>9.2f} {r['seconds']:>8.2f} {r['rate']:>9.0f} {rss:>7}"
        lines.append(line)
    return "\n".join(lines)


@contextmanager
def _redis(url: str | None) -> Iterator[str]:
    if url is not None:
        yield url
    else:
        with redis_server() as started:
            yield started


def _parse(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.peers.run", description=__doc__)
    parser.add_argument("--peer", choices=[*NAMES, "all"], default="all")
    parser.add_argument("--workload", choices=[*WORKLOADS, "all"], default="all")
    parser.add_argument("--processes", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--tasks", type=int, default=NOOP_TASKS, help="noop tasks per run")
    parser.add_argument("--io-tasks", type=int, default=IO_TASKS, help="io tasks per run")
    parser.add_argument("--timeout", type=float, default=RUN_TIMEOUT, help="seconds per run")
    parser.add_argument("--redis-url", help="use this Redis (it gets FLUSHALL) instead of our own")
    parser.add_argument("--json", type=Path, help="write the result records here")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = _parse(argv)
    # SIGTERM unwinds like Ctrl-C, so every worker and the redis-server get stopped.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    peers = NAMES if args.peer == "all" else (args.peer,)
    workloads: Sequence[Workload] = WORKLOADS if args.workload == "all" else (args.workload,)
    records: list[dict[str, Any]] = []
    with _redis(args.redis_url) as url:
        for peer in peers:
            for workload in workloads:
                tasks = args.tasks if workload == "noop" else args.io_tasks
                for processes in args.processes:
                    print(f"-- {peer} {workload} processes={processes} tasks={tasks}", flush=True)
                    try:
                        record = run_peer(peer, workload, processes, tasks, url, args.timeout)
                    except Exception as exc:
                        print(f"   FAILED: {exc}", file=sys.stderr, flush=True)
                        record = {"system": peer, "workload": workload, "processes": processes}
                        record |= {"tasks": tasks, "error": f"{type(exc).__name__}: {exc}"}
                    else:
                        print(f"   {record['rate']:.0f} tasks/s", flush=True)
                    records.append(record)
                    if args.json:
                        args.json.write_text(json.dumps(records, indent=2) + "\n")
    print(format_table(records))
    return 1 if any("error" in r for r in records) else 0


if __name__ == "__main__":
    sys.exit(main())
