"""The demo's nightly ETL, written on crawlq's public API only (the same job as
examples/nightly_etl, pointed at the demo's partner sites).

    nightly (start)  -> listing (one task per page of each sub-domain's report list)
    download (fetch stage, at most 4 at once per sub-domain, every request via the proxy)
      -> parse (HTML, CSV, JSON: one `line` record per table row)
      -> normalize (canonical product and region, revenue in cents; summarized by
         report and product: `sales` records)
    publish (finish): totals per product, the `summary` records and report.md
"""

from __future__ import annotations

import csv
import io
import json
import re
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urljoin

from selectolax.lexbor import LexborHTMLParser

import crawlq
from crawlq.crawl import Fetcher, FetchSettings, Login, Response, Session, Timeouts
from crawlq.pipeline import Pipeline, Record, ResultsStore, StoredResponse

Row = dict[str, str]
Parser = Callable[[str], list[Row]]

REPORT_FILE = "report.md"


@dataclass(frozen=True, kw_only=True)
class EtlConfig:
    """Where the job keeps its data, which sub-domains it reads (base URLs), how it signs in,
    and its network: one fixed egress proxy, and names resolved from `resolve` only."""

    data: Path
    sites: tuple[str, ...] = ()
    username: str = ""
    password: str = field(default="", repr=False)
    proxy: str | None = None
    resolve: Mapping[str, str] = field(default_factory=dict)
    allow_networks: tuple[str, ...] = ()
    per_site: int = 4


# -- parsers: each format's own shape, as rows of text -----------------------------------


def parse_html(text: str) -> list[Row]:
    table = LexborHTMLParser(text).css_first("table.sales")
    if table is None:
        return []
    rows = [[cell.text(strip=True) for cell in tr.css("td")] for tr in table.css("tr")]
    return [
        {"product": p, "region": r, "units": u, "revenue": v}
        for p, r, u, v in (row for row in rows if len(row) == 4)
    ]


def parse_csv(text: str) -> list[Row]:
    lines = [line for line in text.splitlines() if line and not line.startswith("#")]
    reader = csv.DictReader(io.StringIO("\n".join(lines)), delimiter=";")
    return [
        {
            "product": row["Product"],
            "region": row["Region"],
            "units": row["Units"],
            "revenue": row["Revenue EUR"],
        }
        for row in reader
    ]


def parse_json(text: str) -> list[Row]:
    document = json.loads(text)
    return [
        {
            "product": str(line["sku"]),
            "region": str(line["area"]),
            "units": str(line["qty"]),
            "revenue": f"{int(line['amount_cents']) / 100:.2f}",
        }
        for line in document["lines"]
    ]


PARSERS: dict[str, Parser] = {
    "text/html": parse_html,
    "text/csv": parse_csv,
    "application/json": parse_json,
}


# -- normalizing ---------------------------------------------------------------------------


def product_code(raw: str) -> str:
    """ "P-042", "p042", "P 042" -> "P042"."""
    digits = re.sub(r"\D", "", raw)
    return f"P{int(digits):03d}"


def region_code(raw: str) -> str:
    """ "Eu-West", "eu_west", "EU-WEST" -> "eu-west"."""
    return re.sub(r"[\s_]+", "-", raw.strip().lower())


def cents(raw: str) -> int:
    """ "1234,50" (decimal comma), "€1,234.50", "1234.50" -> 123450."""
    text = re.sub(r"[^\d,.]", "", raw)
    if "," in text and ("." not in text or text.rindex(",") > text.rindex(".")):
        text = text.replace(".", "").replace(",", ".")  # the comma is the decimal mark
    else:
        text = text.replace(",", "")
    return round(float(text) * 100)


def summarize(report: str, lines: Iterable[Row]) -> list[Record]:
    """One `sales` record per product of the report: units, revenue and lines summed."""
    totals: dict[str, dict[str, int]] = {}
    for line in lines:
        product = product_code(line["product"])
        total = totals.setdefault(product, {"units": 0, "revenue_cents": 0, "lines": 0})
        total["units"] += int(line["units"])
        total["revenue_cents"] += cents(line["revenue"])
        total["lines"] += 1
    return [
        Record(
            type="sales",
            key=f"{report}/{product}",
            data={"report": report, "product": product, **t},
        )
        for product, t in sorted(totals.items())
    ]


# -- the job -------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class Etl:
    app: crawlq.App
    pipeline: Pipeline
    start: crawlq.Task[Any]


class Transient(Exception):
    """A 5xx from a partner: worth another try later."""


def build(config: EtlConfig, *, parsers: Mapping[str, Parser] | None = None) -> Etl:
    chosen = dict(PARSERS if parsers is None else parsers)
    config.data.mkdir(parents=True, exist_ok=True)
    app = crawlq.App(f"sqlite:///{config.data / 'queue.db'}")
    app.limit("*", concurrency=config.per_site)  # per sub-domain (the default group: host)
    pipeline = Pipeline(app, data=config.data)

    def fetcher() -> Fetcher:
        settings = FetchSettings(
            proxies=(config.proxy,) if config.proxy else (),
            resolve=config.resolve,
            resolve_only=True,  # the partners' names and nothing else
            allow_networks=config.allow_networks,
            timeouts=Timeouts(connect=10, read=30, total=60),
        )
        fetcher = Fetcher(settings)
        for site in config.sites:
            host = site.split("//", 1)[1].split(":", 1)[0]
            fetcher.add_login(host, Login(perform=sign_in(site)))
        return fetcher

    def sign_in(site: str) -> Callable[[Session], Awaitable[None]]:
        async def perform(session: Session) -> None:
            form = {"username": config.username, "password": config.password}
            response = await session.post(f"{site}/login", data=form)
            if response.status != 200:
                raise crawlq.Permanent(f"login to {site} refused: HTTP {response.status}")

        return perform

    app.provide("crawlq.fetcher", fetcher)

    def checked(response: Response) -> Response:
        if response.status >= 500:
            raise Transient(f"{response.url}: HTTP {response.status}")
        if response.status != 200:
            raise crawlq.Permanent(f"{response.url}: HTTP {response.status}")
        return response

    @app.task(start=True)
    async def nightly(ctx: crawlq.Context, _: None) -> None:
        await ctx.schedule_many(listing, [f"{site}/reports?page=0" for site in config.sites])

    @app.task(retry=crawlq.Retry(max_attempts=5, base=0.2, cap=5))
    async def listing(ctx: crawlq.Context, url: str) -> None:
        page = json.loads(checked(await ctx.fetch(url)).text())
        await ctx.schedule_many(download, [urljoin(url, path) for path in page["reports"]])
        if page["next"]:
            # ahead of this page's downloads, so the list has come in before they are done
            await ctx.schedule(listing, urljoin(url, page["next"]), priority=1)

    @pipeline.fetch(retry=crawlq.Retry(max_attempts=5, base=0.2, cap=5))
    async def download(ctx: crawlq.Context, url: str) -> Response:
        return checked(await ctx.fetch(url))

    @pipeline.stage()
    def parse(ctx: crawlq.SyncContext, stored: StoredResponse) -> list[Record]:
        parser = chosen.get(stored.content_type)
        if parser is None:
            raise crawlq.Permanent(f"{stored.url}: no parser for {stored.content_type!r}")
        report = stored.url.rsplit("/", 1)[1].split(".", 1)[0]
        return [
            Record(type="line", key=f"{report}#{n}", data={"report": report, **row})
            for n, row in enumerate(parser(stored.text()))
        ]

    @pipeline.stage()
    def normalize(ctx: crawlq.SyncContext, lines: list[Record]) -> list[Record]:
        if not lines:
            return []
        report = str(lines[0].data["report"])
        return summarize(report, ({k: str(v) for k, v in r.data.items()} for r in lines))

    @pipeline.finish
    def publish(results: ResultsStore) -> list[Record]:
        return publish_summary(results, config.data / REPORT_FILE)

    return Etl(app=app, pipeline=pipeline, start=nightly)


def publish_summary(results: ResultsStore, path: Path) -> list[Record]:
    """Totals per product over every report: `summary` records and a Markdown table."""
    totals: dict[str, dict[str, int]] = {}
    for row in results.rows("sales"):
        total = totals.setdefault(row["product"], {"units": 0, "revenue_cents": 0, "reports": 0})
        total["units"] += int(row["units"])
        total["revenue_cents"] += int(row["revenue_cents"])
        total["reports"] += 1
    summary = [
        Record(type="summary", key=product, data={"product": product, **t})
        for product, t in sorted(totals.items())
    ]
    results.replace("publish", "all", summary)
    lines = [
        "# Sales by product",
        "",
        "| product | reports | units | revenue EUR |",
        "|---|---:|---:|---:|",
    ]
    for record in summary:
        d = record.data
        euros = int(str(d["revenue_cents"])) / 100
        lines.append(f"| {record.key} | {d['reports']:,} | {d['units']:,} | {euros:,.2f} |")
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return summary
