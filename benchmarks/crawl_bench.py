"""crawlq crawl against Scrapy, in the same run, on the same synthetic web (issue 4).

    python -m benchmarks.crawl_bench --write BENCHMARKS.md [--json FILE]
        [--configs throughput,polite,errors] [--crawlers crawlq,scrapy] [--processes 1,2]
    python -m benchmarks.crawl_bench --configs scale --crawlers crawlq   # 200,000 pages

Each (configuration, crawler) pair gets a fresh `SyntheticWeb` in a server process of its
own (so both crawlers meet the same injected errors), the crawler as a subprocess whose
names resolve only to those loopback sites, and judges the crawl from the server's own
request log:

- violations: a request arriving while `limit` others to its host were unanswered
  (concurrency); two request arrivals at a host closer than the delay (interval; robots.txt
  requests count, they are requests too); a robots.txt-disallowed path requested (robots);
  a request arriving at a host after a 429/503 with Retry-After and before that time
  (Retry-After, measured from when the server answered);
- coverage: pages answered 200 over the pages a polite crawler may fetch (all but those
  robots.txt disallows: /page/13, and /page/130 to /page/139 on sites that have them);
- pages/s: those pages over the span from the first request's arrival to the last answer;
- CPU seconds (user + system of the crawler's processes) and peak RSS (summed over its
  process tree, sampled every 0.2 s).

Nothing here reaches beyond 127.0.1.x: both crawlers are told those addresses for the
names, crawlq with `--resolve-only`, Scrapy with a resolver that knows nothing else.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import datetime
import itertools
import json
import os
import platform
import resource
import signal
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from benchmarks.common import PeakRSS
from crawlq.crawl.politeness import MAX_PACING_MARGIN, PACING_MARGIN

ROBOTS = "User-agent: *\nDisallow: /page/13\n"
DISALLOWED = "/page/13"  # a prefix, as robots.txt rules are: /page/130 to /page/139 too


def disallowed(path: str) -> bool:
    return path.startswith(DISALLOWED)


BEGIN, END = "<!-- crawl-bench:begin -->", "<!-- crawl-bench:end -->"
COMMAND = "python -m benchmarks.crawl_bench --write BENCHMARKS.md"
CRAWLERS = ("crawlq", "scrapy")
#: A Retry-After violation this soon after the answer is counted, and also shown apart: such
#: a request may have been on its way before the crawler could read the answer.
RACE = 0.1
GUARD = 900.0  # seconds: a crawl that takes longer has hung


@dataclass(frozen=True, kw_only=True)
class Config:
    name: str
    sites: int
    pages: int
    latency: float
    per_domain: int
    delay: float
    flaky: float = 0.0
    retry_after: int = 1
    concurrency: int = 800  # requests at once overall, the same for both crawlers
    links: int = 0  # more links a page (Site.links), beyond the 2 or 3 every page has
    text: int = 0  # bytes of text a page (Site.text)

    def describe(self) -> str:
        text = (
            f"{self.sites} sites x {self.pages} pages, {self.latency * 1000:g} ms latency,"
            f" {self.per_domain} per domain, delay {self.delay:g} s"
        )
        if self.flaky:
            text += f", {self.flaky:.0%} errors (500/429/503, Retry-After {self.retry_after} s)"
        if self.links or self.text:
            text += (
                f"; pages of {self.text // 1000} KB of text and {self.links} more links each"
                " (root-relative, relative, ../, absolute, with #fragments, to #sections)"
            )
        return text

    @property
    def allowed(self) -> int:
        """Pages of a site that robots.txt lets a crawler fetch."""
        return sum(not disallowed(f"/page/{n}") for n in range(self.pages))

    @property
    def expected(self) -> int:
        return self.sites * self.allowed

    @property
    def lower_bound(self) -> float:
        """The issue's bound: pages x delay of the largest site."""
        return self.pages * self.delay

    @property
    def tight_bound(self) -> float:
        """Seconds no polite crawler can beat: a site's requests (robots.txt and the allowed
        pages) one delay apart, then the last one's answer."""
        return self.allowed * self.delay + self.latency


CONFIGS = {
    "throughput": Config(
        name="throughput", sites=200, pages=50, latency=0.05, per_domain=4, delay=0.0
    ),
    "polite": Config(
        name="polite", sites=50, pages=20, latency=0.05, per_domain=1, delay=0.5, concurrency=200
    ),
    "errors": Config(
        name="errors",
        sites=50,
        pages=50,
        latency=0.05,
        per_domain=4,
        delay=0.0,
        flaky=0.05,
        retry_after=1,
        concurrency=200,
    ),
    # Not in the issue's set (nor in a default run): does the rate hold as a crawl grows?
    "scale": Config(name="scale", sites=1000, pages=200, latency=0.05, per_domain=4, delay=0.0),
    # Not in the issue's set: the throughput crawl with pages as real sites write them
    # (the others' pages are a few hundred bytes with two or three links).
    "rich": Config(
        name="rich",
        sites=100,
        pages=50,
        latency=0.05,
        per_domain=4,
        delay=0.0,
        links=100,
        text=30_000,
    ),
}
ISSUE_CONFIGS = ("throughput", "polite", "errors")
CPU_BOUND = ("throughput", "rich")  # run in each count of processes asked for
SLICES = 5  # the span cut in this many, for the rate in each


# -- the server process -------------------------------------------------------------------


def serve(config: Config, info: Path, log: Path) -> None:
    """Runs the synthetic web until SIGTERM, then writes every request as a JSON line."""
    from crawlq.crawl.testing import Site, SyntheticWeb
    from crawlq.worker import collect_less_often

    collect_less_often()

    async def main() -> None:
        sites = [
            Site(
                name=f"site{n}.test",
                pages=config.pages,
                robots=ROBOTS,
                latency=config.latency,
                flaky=config.flaky,
                retry_after=config.retry_after,
                links=config.links,
                text=config.text,
            )
            for n in range(config.sites)
        ]
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        loop.add_signal_handler(signal.SIGTERM, stop.set)
        async with SyntheticWeb(sites) as net:
            where = {name: [net.addresses[name], net.ports[name]] for name in net.sites}
            partial = info.with_suffix(".part")
            partial.write_text(json.dumps(where))
            partial.rename(info)
            await stop.wait()
        with log.open("w") as out:
            for hit in net.hits:
                row = [hit.host, hit.path, hit.at, hit.ended, hit.status, hit.retry_after]
                out.write(json.dumps(row) + "\n")

    asyncio.run(main())


class Server:
    def __init__(self, config: Config, work: Path) -> None:
        self.config = config
        self.info = work / "server.json"
        self.log = work / "hits.jsonl"
        self.process: subprocess.Popen[bytes] | None = None
        self.sites: dict[str, tuple[str, int]] = {}

    def __enter__(self) -> Server:
        command = [
            sys.executable,
            "-m",
            "benchmarks.crawl_bench",
            "serve",
            json.dumps(asdict(self.config)),
            str(self.info),
            str(self.log),
        ]
        self.process = subprocess.Popen(command, start_new_session=True)
        deadline = time.monotonic() + 60
        while not self.info.exists():
            if self.process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("the synthetic web did not start")
            time.sleep(0.05)
        self.sites = {k: (v[0], int(v[1])) for k, v in json.loads(self.info.read_text()).items()}
        return self

    def cpu(self) -> float | None:
        """The server's CPU seconds so far (None without psutil)."""
        assert self.process is not None
        try:
            import psutil
        except ImportError:
            return None
        times = psutil.Process(self.process.pid).cpu_times()
        return float(times.user + times.system)

    def hits(self) -> list[list[Any]]:
        """Stops the server; its request log."""
        assert self.process is not None
        self.process.send_signal(signal.SIGTERM)
        self.process.wait(120)
        with self.log.open() as lines:
            return [json.loads(line) for line in lines]

    def __exit__(self, *exc: object) -> None:
        if self.process is not None and self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()

    def seeds(self) -> list[str]:
        return [f"http://{name}:{port}/page/0" for name, (_, port) in self.sites.items()]

    def resolve(self) -> dict[str, str]:
        return {name: address for name, (address, _) in self.sites.items()}


# -- judging a crawl from the server's log ------------------------------------------------


def judge(config: Config, hits: list[list[Any]]) -> dict[str, Any]:
    by_host: dict[str, list[tuple[str, float, float, int | None, str | None]]] = defaultdict(list)
    for host, path, at, ended, status, retry_after in hits:
        by_host[host].append((path, at, ended if ended is not None else at, status, retry_after))
    concurrency = interval = robots = retry_after_early = retry_after_race = 0
    min_gap: float | None = None
    covered: set[tuple[str, str]] = set()
    for host, rows in by_host.items():
        rows.sort(key=lambda r: r[1])
        # concurrency: at each arrival, how many earlier requests are still unanswered
        open_ends: list[float] = []
        for _path, at, ended, _status, _ra in rows:
            open_ends = [e for e in open_ends if e > at]
            if len(open_ends) + 1 > config.per_domain:
                concurrency += 1
            open_ends.append(ended)
        if config.delay > 0:
            for earlier, later in itertools.pairwise(rows):
                gap = later[1] - earlier[1]
                min_gap = gap if min_gap is None else min(min_gap, gap)
                if gap < config.delay:
                    interval += 1
        pauses = [
            (ended, ended + float(ra))
            for _p, _at, ended, status, ra in rows
            if status in (429, 503) and ra is not None and ra.isdigit()
        ]
        for path, at, _ended, status, _ra in rows:
            if disallowed(path):
                robots += 1
            if any(start < at < until for start, until in pauses):
                retry_after_early += 1
                if not any(start + RACE < at < until for start, until in pauses):
                    retry_after_race += 1
            if status == 200 and path.startswith("/page/") and not disallowed(path):
                covered.add((host, path))
    starts = [h[2] for h in hits]
    ends = [h[3] if h[3] is not None else h[2] for h in hits]
    span = (max(ends) - min(starts)) if hits else 0.0
    pages = len(covered)
    answered = [ended for host, path, _at, ended, status, _ra in hits if status == 200]
    return {
        "requests": len(hits),
        "pages": pages,
        "expected": config.expected,
        "coverage": pages / config.expected,
        "span": span,
        "pages_per_s": pages / span if span > 0 else 0.0,
        "slice_rates": slice_rates(answered, min(starts, default=0.0), span),
        "violations": {
            "concurrency": concurrency,
            "interval": interval,
            "robots": robots,
            "retry_after": retry_after_early,
        },
        "retry_after_within_race": retry_after_race,
        "min_gap": min_gap,
    }


def slice_rates(ends: list[float | None], start: float, span: float) -> list[float]:
    """Answers a second in each of SLICES equal parts of the span: a rate that sags as the
    queue grows shows here."""
    if span <= 0:
        return []
    width = span / SLICES
    counts = [0] * SLICES
    for end in ends:
        if end is not None:
            counts[min(SLICES - 1, int((end - start) / width))] += 1
    return [count / width for count in counts]


# -- running one crawler ------------------------------------------------------------------


def crawlq_command(config: Config, server: Server, out: Path, processes: int) -> list[str]:
    command = [sys.executable, "-m", "crawlq", "crawl", *server.seeds()]
    for name, address in server.resolve().items():
        command += ["--resolve", f"{name}={address}"]
    command += [
        "--resolve-only",
        "--allow-network",
        "127.0.0.0/8",
        "--out",
        str(out),
        "--no-progress",
        "--concurrency-per-domain",
        str(config.per_domain),
        "--delay",
        str(config.delay),
        "--concurrency",
        str(config.concurrency),
        "--max-attempts",
        "4",
        "--retry-delay",
        "0.2",
        "--log-level",
        "WARNING",
    ]
    if processes > 1:
        command += ["--processes", str(processes)]
    return command


def scrapy_command(config: Config, server: Server, out: Path) -> list[str]:
    spec = {
        "seeds": server.seeds(),
        "resolve": server.resolve(),
        "per_domain": config.per_domain,
        "delay": config.delay,
        "concurrency": config.concurrency,
        "out": str(out),
    }
    (out / "spec.json").write_text(json.dumps(spec))
    return [sys.executable, "-m", "benchmarks.scrapy_spider", str(out / "spec.json")]


def run_one(config: Config, crawler: str, work: Path, processes: int) -> dict[str, Any]:
    work.mkdir(parents=True)
    out = work / "out"
    out.mkdir()
    with Server(config, work) as server:
        if crawler == "crawlq":
            command = crawlq_command(config, server, out, processes)
        else:
            command = scrapy_command(config, server, out)
        server_before = server.cpu()
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        started = time.monotonic()
        with (work / "crawler.log").open("wb") as log:
            process = subprocess.Popen(
                command, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT
            )
            with PeakRSS([process.pid]) as rss:
                try:
                    code = process.wait(GUARD)
                except subprocess.TimeoutExpired:
                    process.kill()
                    code = process.wait()
        wall = time.monotonic() - started
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        server_after = server.cpu()
        hits = server.hits()
    result = judge(config, hits)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    result.update(
        config=config.name,
        crawler=crawler,
        processes=processes if crawler == "crawlq" else 1,
        exit_code=code,
        wall=wall,
        cpu=cpu,
        peak_rss_mb=rss.peak_mb,
        server_cpu=None
        if server_before is None or server_after is None
        else server_after - server_before,
        cpu_ms_per_page=1000 * cpu / max(1, result["pages"]),
    )
    if code != 0:
        result["log_tail"] = (work / "crawler.log").read_text(errors="replace")[-2000:]
    return result


# -- the report ---------------------------------------------------------------------------


def _violations(r: dict[str, Any]) -> str:
    v = r["violations"]
    total = sum(v.values())
    if not total:
        return "0"
    parts = [f"{k} {n}" for k, n in v.items() if n]
    if r.get("retry_after_within_race"):
        race = r["retry_after_within_race"]
        parts.append(f"{race} of those within {RACE * 1000:g} ms of the 429/503")
    return f"**{total}** ({', '.join(parts)})"


def _seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def table(results: list[dict[str, Any]]) -> str:
    rows = [
        "| config | crawler | pages/s | x Scrapy | violations | coverage | crawl s | wall s"
        " | CPU s | CPU ms/page | peak RSS MB | server CPU s |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, _config in CONFIGS.items():
        same = [r for r in results if r["config"] == name]
        scrapy = _scrapy_of(results, name)
        for r in sorted(same, key=lambda r: (CRAWLERS.index(r["crawler"]), r["processes"])):
            crawler = r["crawler"]
            ratio = ""
            if scrapy is not None and scrapy["pages_per_s"] > 0:
                ratio = f"{r['pages_per_s'] / scrapy['pages_per_s']:.1f}x"
            label = crawler
            if crawler == "crawlq" and r["processes"] > 1:
                label += f" ({r['processes']} processes)"
            rss = r["peak_rss_mb"]
            rows.append(
                f"| {name} | {label} | {r['pages_per_s']:,.0f} | {ratio} | {_violations(r)}"
                f" | {r['pages']}/{r['expected']} ({r['coverage']:.1%}) | {r['span']:.2f}"
                f" | {r['wall']:.2f} | {r['cpu']:.1f} | {r['cpu_ms_per_page']:.2f}"
                f" | {'-' if rss is None else f'{rss:.0f}'} | {_seconds(r.get('server_cpu'))} |"
            )
    return "\n".join(rows)


def targets(results: list[dict[str, Any]]) -> list[str]:
    lines = []
    crawlq = [r for r in results if r["crawler"] == "crawlq"]
    bad = [r for r in crawlq if sum(r["violations"].values())]
    lines.append(
        "zero politeness violations (crawlq): "
        + ("met" if not bad else "NOT met: " + ", ".join(r["config"] for r in bad))
    )
    short = [r for r in crawlq if r["coverage"] < 1.0]
    lines.append(
        "full coverage (crawlq): "
        + ("met" if not short else "NOT met: " + ", ".join(r["config"] for r in short))
    )
    for config, label in (("throughput", "throughput"), ("rich", "rich pages (not a target)")):
        theirs = _scrapy_of(results, config)
        mine = [r for r in crawlq if r["config"] == config]
        if mine and theirs and theirs["pages_per_s"]:
            ratios = [(r["processes"], r["pages_per_s"] / theirs["pages_per_s"]) for r in mine]
            met = "met" if max(ratio for _, ratio in ratios) >= 10 else "NOT met"
            each = ", ".join(f"{ratio:.1f}x in {n} process{'es' * (n > 1)}" for n, ratio in ratios)
            lines.append(f"{label} at least 10x Scrapy: {met} ({each})")
    polite = next((r for r in crawlq if r["config"] == "polite"), None)
    if polite:
        bound, tight = CONFIGS["polite"].lower_bound, CONFIGS["polite"].tight_bound
        over = polite["span"] / bound - 1
        lines.append(
            f"polite within 2% of the lower bound ({bound:g} s): "
            f"{'met' if over <= 0.02 else 'NOT met'} (crawl {polite['span']:.2f} s,"
            f" {over:+.1%}; {polite['span'] / tight - 1:+.1%} against the tight bound"
            f" {tight:g} s; command wall time {polite['wall']:.2f} s)"
        )
    return lines


def _scrapy_of(results: list[dict[str, Any]], config: str) -> dict[str, Any] | None:
    return next((r for r in results if (r["config"], r["crawler"]) == (config, "scrapy")), None)


def section(results: list[dict[str, Any]], load: str, date: str) -> str:
    configs = "\n".join(f"- **{c.name}**: {c.describe()}" for c in CONFIGS.values())
    return f"""{BEGIN}
### Crawling: crawlq against Scrapy (issue 4)

```sh
{COMMAND}
```

Run {date} on {platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()};
load before the run: `{load}`. Both crawlers in the same run, each against a fresh
synthetic web (benchmarks/crawl_bench.py, a server process of its own on 127.0.1.x), with
the same seeds (every site's /page/0), the same per-domain limits, the same overall
concurrency and a robots.txt disallowing /page/13 on every site:

{configs}

{table(results)}

Pages/s, coverage and violations come from the server's request log: pages answered 200
over the time from the first request's arrival to the last answer ("crawl s"); "wall s" is
the crawler's command from start to exit (start-up included). CPU is the crawler's user +
system time, peak RSS its process tree's. Scrapy {_scrapy_version()} runs with
CONCURRENT_REQUESTS_PER_DOMAIN and DOWNLOAD_DELAY as above, RANDOMIZE_DOWNLOAD_DELAY off,
ROBOTSTXT_OBEY on, AutoThrottle and the HTTP cache off, memory queues (no JOBDIR), a JSON
lines feed, a resolver that knows only the synthetic sites (benchmarks/scrapy_spider.py).
Scrapy has no Retry-After support: its retry middleware sends 429/503 again at once.

Targets:

{chr(10).join("- " + line for line in targets(results))}

Notes:

- crawlq paces each request to a host (robots.txt included) {PACING} past the queue's
  interval: it reserves its send time in the backend, after the last request any worker
  reserved and after this worker's own last send; the server's arrival stamps lag by a few
  milliseconds when many requests land at once, and without the margin that showed as
  intervals of 0.499 s. The margin costs about {MARGIN_COST:g} s over the polite crawl's
  20 intervals at most (the polite crawl's time against its lower bound is in the table).
- A request can reach a host just after its 429/503 was answered and before the crawler has
  read that answer (up to 4 are in flight per host); those are counted as violations too,
  and shown apart. crawlq pauses the host in the worker as soon as the answer's head is
  read (then blocks it in the queue); before writing a request it lets the host's answers
  already in (in their sockets, or parsed) be handled, then checks the pause. What is left
  is a request already on its way as the answer left (tens of microseconds apart). Scrapy
  has no Retry-After support and retries at once.
- Scrapy's concurrency violations are real by the server's log: a request arrived while 4
  earlier ones to the same host were still unanswered (the server's interval for a request
  lies inside the client's).
{END}"""


PACING = f"by {PACING_MARGIN:.0%} of the interval (at most {MAX_PACING_MARGIN * 1000:g} ms)"
#: What the margin adds to the polite crawl's 20 intervals of 0.5 s.
MARGIN_COST = 20 * min(MAX_PACING_MARGIN, 0.5 * PACING_MARGIN)


def _scrapy_version() -> str:
    try:
        from importlib.metadata import version

        return version("scrapy")
    except Exception:
        return "?"


def write_section(path: Path, text: str) -> None:
    document = path.read_text() if path.exists() else ""
    if BEGIN in document and END in document:
        head, rest = document.split(BEGIN, 1)
        _, tail = rest.split(END, 1)
        document = head + text + tail
    else:
        document = document.rstrip("\n") + "\n\n" + text + "\n"
    path.write_text(document)


def _process_counts(crawler: str, config: str, counts: list[int]) -> list[int]:
    """crawlq runs in each count of processes where CPU bounds the crawl, else in the first;
    Scrapy has one process."""
    if crawler != "crawlq":
        return [1]
    return counts if config in CPU_BOUND else counts[:1]


def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else argv
    if args[:1] == ["serve"]:
        serve(Config(**json.loads(args[1])), Path(args[2]), Path(args[3]))
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--configs", default=",".join(ISSUE_CONFIGS), help=",".join(CONFIGS))
    parser.add_argument("--crawlers", default=",".join(CRAWLERS))
    parser.add_argument(
        "--processes",
        default="1,2",
        help="crawlq crawl --processes: each of these in the throughput configuration (the"
        " one bound by CPU), the first in the others",
    )
    parser.add_argument("--write", type=Path, help="update this file's crawl section")
    parser.add_argument("--json", type=Path, help="write every result here")
    parser.add_argument("--from-json", type=Path, help="write the section of a past --json")
    parser.add_argument("--keep", type=Path, help="keep logs and output in this new folder")
    parser.add_argument("--sites", type=int, help="fewer sites, for a quick try (not reported)")
    options = parser.parse_args(args)
    if options.from_json:
        saved = json.loads(options.from_json.read_text())
        if options.write:
            date = saved.get("date", "(date not saved)")
            write_section(options.write, section(saved["results"], saved["load"], date))
        return
    load = subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
    date = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    results = []
    with tempfile.TemporaryDirectory(prefix="crawlbench-") as temporary:
        scratch = options.keep or temporary
        counts = [int(n) for n in options.processes.split(",")]
        for name in options.configs.split(","):
            config = CONFIGS[name]
            if options.sites:
                config = dataclasses.replace(config, sites=options.sites)
            for crawler in options.crawlers.split(","):
                for processes in _process_counts(crawler, name, counts):
                    work = Path(scratch) / f"{name}-{crawler}-{processes}"
                    result = run_one(config, crawler, work, processes)
                    results.append(result)
                    brief = {k: v for k, v in result.items() if k != "log_tail"}
                    print(json.dumps(brief), flush=True)
                    if "log_tail" in result:
                        print(result["log_tail"], file=sys.stderr)
    print(table(results))
    print("\n".join(targets(results)))
    if options.json:
        saved = {"date": date, "load": load, "results": results}
        options.json.write_text(json.dumps(saved, indent=1))
    if options.write:
        write_section(options.write, section(results, load, date))


if __name__ == "__main__":
    main()
