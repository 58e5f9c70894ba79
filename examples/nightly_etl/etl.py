"""The nightly ETL: log in to the partners' sites, download every report (HTML, CSV or
JSON), parse, normalize and summarize by key, publish the morning report.

    crawlq start nightly_etl.etl:app                      # from examples/: schedule tonight's run
    crawlq worker nightly_etl.etl:app --queue nightly --queue listing --queue download -c 500
    crawlq worker nightly_etl.etl:app --queue parse --queue normalize --processes 2
    crawlq reprocess nightly_etl.etl:app parse            # after a parser change: no fetching

Settings come from the environment (ETL_SITES: the partners' sub-domains, space separated;
ETL_USER, ETL_PASSWORD; ETL_PROXY: the fixed egress proxy; ETL_RESOLVE: "host=address ...";
ETL_ALLOW: private networks the partners live on, "10.0.0.0/8 ..." (refused otherwise);
ETL_DATA: where the queue, the raw reports and the results go).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from urllib.parse import urljoin, urlsplit

import crawlq
from crawlq.crawl import Fetcher, FetchSettings, Login, Response, Session
from crawlq.pipeline import Pipeline, Record, ResultsStore, StoredResponse

from .normalize import summarize
from .parsers import BY_CONTENT_TYPE

SITES = os.environ.get("ETL_SITES", "").split()
DATA = Path(os.environ.get("ETL_DATA", "etl-data"))
PROXY = os.environ.get("ETL_PROXY")
RESOLVE = dict(item.split("=", 1) for item in os.environ.get("ETL_RESOLVE", "").split())
ALLOW = tuple(os.environ.get("ETL_ALLOW", "").split())

app = crawlq.App(f"sqlite:///{DATA / 'queue.db'}")
app.limit("*", concurrency=4)  # at most 4 requests at once per sub-domain (group: host)
pipeline = Pipeline(app, data=DATA)  # raw reports: DATA/warc/, records: DATA/results.sqlite


def sign_in(site: str) -> Login:
    async def perform(session: Session) -> None:
        form = {"username": os.environ["ETL_USER"], "password": os.environ["ETL_PASSWORD"]}
        response = await session.post(urljoin(site, "/login"), data=form)
        if response.status != 200:
            raise crawlq.Permanent(f"login to {site} refused: HTTP {response.status}")

    return Login(perform=perform)


def fetcher() -> Fetcher:
    settings = FetchSettings(
        proxies=(PROXY,) if PROXY else (),  # every request leaves through the egress proxy
        resolve=RESOLVE,
        resolve_only=bool(RESOLVE),
        allow_networks=ALLOW,
    )
    shared = Fetcher(settings)
    for site in SITES:
        shared.add_login(urlsplit(site).hostname or site, sign_in(site))
    return shared


app.provide("crawlq.fetcher", fetcher)


class Transient(Exception):
    """A 5xx: worth another try later."""


def ok(response: Response) -> Response:
    if response.status >= 500:
        raise Transient(f"{response.url}: HTTP {response.status}")
    if response.status != 200:
        raise crawlq.Permanent(f"{response.url}: HTTP {response.status}")
    return response


@app.task(start=True)
async def nightly(ctx: crawlq.Context, _: None) -> None:
    await ctx.schedule_many(listing, [urljoin(site, "/reports?page=0") for site in SITES])


@app.task(retry=crawlq.Retry(max_attempts=5, base=0.5))
async def listing(ctx: crawlq.Context, url: str) -> None:
    page = json.loads(ok(await ctx.fetch(url)).text())
    await ctx.schedule_many(download, [urljoin(url, path) for path in page["reports"]])
    if page["next"]:
        # ahead of this page's downloads, so the list has come in before they are done
        await ctx.schedule(listing, urljoin(url, page["next"]), priority=1)


@pipeline.fetch(retry=crawlq.Retry(max_attempts=5, base=0.5))
async def download(ctx: crawlq.Context, url: str) -> Response:
    return ok(await ctx.fetch(url))  # stored in WARC; parse gets its URL


@pipeline.stage()
def parse(ctx: crawlq.SyncContext, stored: StoredResponse) -> list[Record]:
    parser = BY_CONTENT_TYPE.get(stored.content_type)
    if parser is None:
        raise crawlq.Permanent(f"{stored.url}: no parser for {stored.content_type!r}")
    report = stored.url.rsplit("/", 1)[1].split(".", 1)[0]
    return [
        Record(type="line", key=f"{report}#{n}", data={"report": report, **row})
        for n, row in enumerate(parser(stored.text()))
    ]


@pipeline.stage()
def normalize(ctx: crawlq.SyncContext, lines: list[Record]) -> list[Record]:
    rows = [{k: str(v) for k, v in line.data.items()} for line in lines]
    return summarize(rows[0]["report"], rows) if rows else []


@pipeline.finish
def publish(results: ResultsStore) -> list[Record]:
    """Totals per product over every report: `summary` records and DATA/report.md."""
    totals: dict[str, dict[str, int]] = {}
    for row in results.rows("sales"):
        total = totals.setdefault(row["product"], {"units": 0, "revenue_cents": 0, "reports": 0})
        total["units"] += row["units"]
        total["revenue_cents"] += row["revenue_cents"]
        total["reports"] += 1
    summary = [
        Record(type="summary", key=product, data={"product": product, **t})
        for product, t in sorted(totals.items())
    ]
    results.replace("publish", "all", summary)
    table = ["| product | reports | units | revenue EUR |", "|---|---:|---:|---:|"]
    table += [
        f"| {p} | {t['reports']:,} | {t['units']:,} | {t['revenue_cents'] / 100:,.2f} |"
        for p, t in sorted(totals.items())
    ]
    (DATA / "report.md").write_text("# Sales by product\n\n" + "\n".join(table) + "\n")
    return summary
