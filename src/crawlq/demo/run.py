"""`crawlq demo`: the nightly ETL end to end, on this machine alone.

Starts the partner sites (sub-domains on 127.0.3.x, a login, reports in HTML, CSV and
JSON, latency and a few transient errors) and the egress proxy, runs the ETL on the SQLite
default with a live progress display, publishes the summary, exports it, checks from the
sites' own log that no sub-domain ever had more than 4 requests at once and that every
request came through the proxy, prints where everything is, and shuts it all down.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import shutil
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from ..errors import ConfigError
from ..results import Record, export
from ..worker import Worker, WorkerStats
from .etl import REPORT_FILE, Etl, EtlConfig, Parser, build
from .site import (
    EGRESS_ADDRESS,
    HOSTS,
    NETWORK,
    USERNAME,
    DemoServers,
    DemoSite,
    peak_in_flight,
)

DEFAULT_OUT = Path("crawlq-demo")
MARKER = ".crawlq-demo"
STAGES = ("listing", "download", "parse", "normalize")
EXPORTS = (("summary", "jsonl"), ("summary", "csv"), ("summary", "parquet"), ("sales", "parquet"))


@dataclass(frozen=True, kw_only=True)
class DemoResult:
    out: Path
    reports: int
    elapsed: float
    worker: WorkerStats
    dead: int
    summary: list[Record]
    peak: dict[str, int]  # per sub-domain, from the sites' log
    requests: int  # the sites saw
    proxied: int  # the proxy forwarded
    from_egress: bool  # every request the sites saw came from the egress address
    matches: bool  # the published totals are the sites' own
    exports: list[Path]


def prepare(out: Path) -> None:
    """Empties `out` for a new run: only a folder the demo made (it holds MARKER)."""
    if out.exists() and any(out.iterdir()):
        if not (out / MARKER).exists():
            raise ConfigError(f"{out} is not empty and not a crawlq demo folder; choose --out")
        shutil.rmtree(out)
    out.mkdir(parents=True, exist_ok=True)
    (out / MARKER).write_text("made by `crawlq demo`; deleted by its next run\n")


def config_for(servers: DemoServers, out: Path) -> EtlConfig:
    return EtlConfig(
        data=out,
        sites=tuple(servers.base(host) for host in HOSTS),
        username=USERNAME,
        password=servers.site.password,
        proxy=servers.proxy_url,
        resolve=servers.resolve,
        allow_networks=(NETWORK,),
    )


async def run_etl(
    etl: Etl, servers: DemoServers, console: Console, *, progress: bool = True
) -> tuple[WorkerStats, int]:
    """Starts the job and works every queue until nothing is left; (worker stats, dead)."""
    await etl.app.aschedule(etl.start, None)
    stop = asyncio.Event()
    shown = asyncio.create_task(_progress(etl, servers, console, stop, progress), name="progress")
    try:
        stats = await Worker(etl.app, burst=True, concurrency=200, burst_horizon=10).run()
    finally:
        stop.set()
        await shown
    backend = await etl.app.backend()
    dead = sum(q.dead for q in await backend.queue_stats(list(etl.app.tasks)))
    return stats, dead


async def _progress(
    etl: Etl, servers: DemoServers, console: Console, stop: asyncio.Event, enabled: bool
) -> None:
    columns = (
        TextColumn("{task.description:<10}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[note]}"),
        TimeElapsedColumn(),
    )
    with Progress(*columns, console=console, disable=not enabled, transient=False) as bars:
        ids = {name: bars.add_task(name, total=None, note="") for name in STAGES}
        backend = await etl.app.backend()
        while True:
            queues = {q.name: q for q in await backend.queue_stats(list(STAGES))}
            done = await asyncio.to_thread(etl.pipeline.results.done)
            site = servers.site
            peak = max(site.peak.values(), default=0)
            for name in STAGES:
                queued = queues[name].total if name in queues else 0
                finished = done.get(name, 0)
                if name == "listing":
                    finished = sum(1 for h in site.hits if h.path.startswith("/reports?"))
                note = ""
                if name == "download":
                    note = (
                        f"peak {peak} at once per sub-domain (limit 4), "
                        f"{len(servers.proxy_requests):,} requests via the proxy"
                    )
                bars.update(ids[name], completed=finished, total=finished + queued, note=note)
            if stop.is_set():
                break
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), 0.25)


@contextlib.contextmanager
def _quiet_retries() -> Iterator[None]:
    """The injected errors are expected: their retries are counted in the summary rather than
    logged one by one, unless logging was asked for below warnings."""
    logger = logging.getLogger("crawlq.worker")
    level = logger.level
    if logger.getEffectiveLevel() >= logging.WARNING:
        logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(level)


def totals_match(site: DemoSite, summary: list[Record]) -> bool:
    """The published totals per product are exactly the sites' own."""
    published = {
        r.key: (int(str(r.data["units"])), int(str(r.data["revenue_cents"]))) for r in summary
    }
    return published == {product: (t.units, t.cents) for product, t in site.truth().items()}


async def run_demo(
    out: Path = DEFAULT_OUT,
    *,
    reports: int = 1000,
    latency: float = 0.02,
    errors: float = 0.02,
    progress: bool = True,
    console: Console | None = None,
    parsers: Mapping[str, Parser] | None = None,
) -> DemoResult:
    console = console or Console()
    errs = Console(stderr=True) if progress else console
    prepare(out)
    site = DemoSite(reports=reports, latency=latency, errors=errors)
    console.print(
        f"crawlq demo: {reports:,} reports on {len(HOSTS)} partner sub-domains"
        f" (127.0.3.x, login required, {latency * 1000:g} ms latency, ~{errors:.0%} transient"
        f" errors), every request through one egress proxy, at most 4 at once per sub-domain"
    )
    started = time.monotonic()
    with DemoServers(site) as servers, _quiet_retries():
        etl = build(config_for(servers, out), parsers=parsers)
        try:
            stats, dead = await run_etl(etl, servers, errs, progress=progress)
            summary = etl.pipeline.run_finish()
        finally:
            await etl.app.aclose()
            etl.pipeline.results.close()
        proxied = len(servers.proxy_requests)
    elapsed = time.monotonic() - started
    exports = []
    for type_, format_ in EXPORTS:
        path = out / "exports" / f"{type_}.{format_}"
        export(etl.pipeline.results, type_, path)
        exports.append(path)
    etl.pipeline.results.close()
    result = DemoResult(
        out=out,
        reports=reports,
        elapsed=elapsed,
        worker=stats,
        dead=dead,
        summary=summary,
        exports=exports,
        peak=peak_in_flight(site.hits),
        requests=len(site.hits),
        proxied=proxied,
        from_egress=all(h.peer == EGRESS_ADDRESS for h in site.hits),
        matches=totals_match(site, summary),
    )
    report(result, console)
    return result


def report(result: DemoResult, console: Console) -> None:
    table = Table(title="Sales by product (published report)")
    for name, justify in (("product", "left"), ("reports", "right"), ("units", "right")):
        table.add_column(name, justify=justify)  # type: ignore[arg-type]
    table.add_column("revenue EUR", justify="right")
    for record in result.summary:
        d = record.data
        euros = int(str(d["revenue_cents"])) / 100
        table.add_row(record.key, f"{d['reports']:,}", f"{d['units']:,}", f"{euros:,.2f}")
    console.print(table)
    out = result.out
    peak = max(result.peak.values(), default=0)
    ok = "yes" if result.matches else "NO"
    console.print(
        f"done in {result.elapsed:.1f}s: {result.worker.done:,} tasks, "
        f"{result.worker.failed} transient failures retried, {result.dead} dead letters\n"
        f"politeness (the sites' log): at most {peak} requests at once per sub-domain (limit 4)\n"
        f"proxy: {result.proxied:,} requests forwarded, the sites saw {result.requests:,},"
        f" all from the egress address: {'yes' if result.from_egress else 'NO'}\n"
        f"totals equal the partners' own figures: {ok}\n"
        f"\noutputs in {out}/:\n"
        f"  {REPORT_FILE:<18} the published report\n"
        f"  {'results.sqlite':<18} results store: tables line, sales, summary\n"
        f"  {'warc/':<18} every downloaded report, raw (WARC), with index.sqlite\n"
        f"  {'exports/':<18} " + ", ".join(p.name for p in result.exports) + "\n"
        f"  {'queue.db':<18} the queue (crawlq stats --backend sqlite:///{out}/queue.db)"
    )
    env = "" if out == DEFAULT_OUT else f"CRAWLQ_DEMO_DIR={out} "
    console.print(
        "\nre-run the parsers and the normalizer over the stored reports, without fetching:\n"
        f"  {env}crawlq reprocess crawlq.demo.app:app parse\n"
        f"  {env}crawlq export crawlq.demo.app:app sales sales.csv"
    )
