"""`crawlq crawl` over a site made only of hostile pages (crawlq.testing.hostile): does the
crawl finish, does every page get a record with its reason, does the worker's memory stay
bounded as the page count grows?

    python -m benchmarks.hostile_bench [--pages 200,1000] [--timeout 2] [--per-host 10]

For each page count: a fresh HostileServer in this process (gzip/deflate bombs of 1 GiB
each, drips, endless bodies, huge headers, TLS errors... every kind, in turn), and the real
CLI in a subprocess crawling it from an index page, its names resolved to the server's
loopback address only, `--per-host` pages on each host name (a host whose requests keep
timing out is backed off, exponentially: more pages per host measure that instead). The
crawler's RSS is read from /proc every 0.1 s (and its peak, from
the kernel, when it exits); "RSS at 10%" is its RSS once a tenth of the pages have a record,
"RSS at 90%" once nine tenths have. Prints markdown tables.

What bounds the memory is what is in flight, not the page count: at most `--concurrency`
bodies at once, each at most max_bytes as received and max_bytes decoded. The peak is the
largest such coincidence a run happens to meet, so it creeps up with longer runs; the
median and the RSS late in the run show whether anything accumulates.
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
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from crawlq.testing.hostile import HostileServer

ADDRESS = "127.0.6.1"
DOMAIN = "hostile.test"
GUARD = 1800.0  # seconds: a crawl that takes longer has hung


@dataclass(kw_only=True)
class Run:
    pages: int
    records: int = 0
    pages_recorded: int = 0
    wall: float = 0.0
    peak_mb: float = 0.0
    rss_at_10: float | None = None
    rss_at_90: float | None = None
    samples: list[float] = field(default_factory=list)
    rss_last: float = 0.0
    exit_code: int | None = None
    reasons: Counter[str] = field(default_factory=Counter)


def rss_mb(pid: int) -> float | None:
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return None
    for line in status.splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return None


def count_lines(path: Path) -> int:
    try:
        with open(path, "rb") as file:
            return sum(1 for _ in file)
    except FileNotFoundError:
        return 0


def wait_child(pid: int) -> tuple[int, float]:
    """Reaps the child: its exit code and its peak RSS in MB (ru_maxrss of this child)."""
    _, status, usage = os.wait4(pid, 0)
    return os.waitstatus_to_exitcode(status), usage.ru_maxrss / 1024


async def crawl(pages: int, *, timeout: float, per_host: int, workdir: Path) -> Run:
    run = Run(pages=pages)
    out = workdir / f"crawl-{pages}"
    async with HostileServer(ADDRESS, name=DOMAIN) as server:
        kinds = [kind for kind in server.kinds if kind != "ok"]
        hosts = max(1, pages // per_host)
        names = [f"h{n}.{DOMAIN}" for n in range(hosts)]
        server.links = [
            server.url(kinds[n % len(kinds)], n, host=names[n % hosts]) for n in range(pages)
        ]
        resolve = [f"--resolve={name}={ADDRESS}" for name in [DOMAIN, *names]]
        command = [
            sys.executable,
            "-m",
            "crawlq",
            "crawl",
            server.url("index"),
            f"--out={out}",
            f"--allow-domain={DOMAIN}",
            *resolve,
            "--resolve-only",
            "--allow-network=127.0.0.0/8",
            f"--timeout={timeout}",
            "--max-attempts=2",
            "--retry-delay=0.5",
            "--concurrency=200",
            "--concurrency-per-domain=10",
            "--no-progress",
            "--log-level=error",
        ]
        started = time.monotonic()
        stderr = workdir / f"stderr-{pages}.txt"
        with open(stderr, "wb") as errors_file:
            # Popen, not asyncio's subprocess: this process reaps the child itself (wait4),
            # for the kernel's figure of its peak RSS.
            process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=errors_file)
        reaped = asyncio.get_running_loop().run_in_executor(None, wait_child, process.pid)
        records = out / "pages.jsonl"
        while not reaped.done():
            if time.monotonic() - started > GUARD:
                process.kill()
                break
            rss = rss_mb(process.pid)
            if rss is not None:
                run.rss_last = rss
                run.samples.append(rss)
                done = count_lines(records)
                if run.rss_at_10 is None and done >= pages / 10:
                    run.rss_at_10 = rss
                if run.rss_at_90 is None and done >= pages * 0.9:
                    run.rss_at_90 = rss
            await asyncio.sleep(0.1)
        run.exit_code, run.peak_mb = await reaped
        process.returncode = run.exit_code  # reaped above: Popen must not wait for it again
        run.wall = time.monotonic() - started
        errors = stderr.read_text(errors="replace").strip()
        if errors and run.exit_code != 0:
            print(f"crawler stderr ({pages} pages):\n{errors[-2000:]}", file=sys.stderr)
    final: dict[str, dict[str, object]] = {}
    for line in records.read_text().splitlines():
        record = json.loads(line)
        run.records += 1
        final[str(record["url"])] = record  # a retried page: its last record counts
    wanted = set(server.links)
    run.pages_recorded = len(wanted & set(final))
    run.reasons = Counter(
        str(record["error"] or f"ok ({record['status']})")
        for url, record in final.items()
        if url in wanted
    )
    return run


def table(runs: list[Run], timeout: float, per_host: int) -> str:
    def mb(value: float | None) -> str:
        return "-" if value is None else f"{value:.0f}"

    lines = [
        f"Hostile crawl: `crawlq crawl`, total timeout {timeout:g} s, max 2 attempts, "
        f"concurrency 200 (10 per host), {per_host} pages per host, 1 GiB bombs, "
        "default 10 MiB max_bytes",
        "",
        "| pages | with a record | records written | exit | wall s | peak RSS MB "
        "| median RSS MB | RSS at 10% MB | RSS at 90% MB |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for run in runs:
        median = statistics.median(run.samples) if run.samples else None
        lines.append(
            f"| {run.pages} | {run.pages_recorded} | {run.records} | {run.exit_code} "
            f"| {run.wall:.1f} | {run.peak_mb:.0f} | {mb(median)} | {mb(run.rss_at_10)} "
            f"| {mb(run.rss_at_90)} |"
        )
    reasons = sorted(set().union(*(run.reasons for run in runs)))
    lines += [
        "",
        "| reason (last record of each page) | "
        + " | ".join(f"{run.pages} pages" for run in runs)
        + " |",
        "|---|" + "---:|" * len(runs),
    ]
    for reason in reasons:
        counts = " | ".join(str(run.reasons.get(reason, 0)) for run in runs)
        lines.append(f"| {reason} | {counts} |")
    return "\n".join(lines)


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pages", default="200,1000", help="page counts, comma-separated")
    parser.add_argument("--timeout", type=float, default=2.0, help="the crawler's --timeout")
    parser.add_argument("--per-host", type=int, default=10, help="pages per host name")
    args = parser.parse_args()
    runs = []
    with tempfile.TemporaryDirectory(prefix="hostile-bench-") as tmp:
        for pages in (int(n) for n in args.pages.split(",")):
            runs.append(
                await crawl(pages, timeout=args.timeout, per_host=args.per_host, workdir=Path(tmp))
            )
    print(table(runs, args.timeout, args.per_host))


if __name__ == "__main__":
    asyncio.run(main())
