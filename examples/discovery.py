"""Recursive discovery: each document names others; each is scheduled as it is found, and
the fetch stage's `seen` memory (with the queue's uniqueness) stops loops.

    crawlq start discovery:app --element '"https://docs.example.org/index.html"'
    crawlq worker discovery:app --burst
    crawlq export discovery:app document documents.jsonl
"""

from __future__ import annotations

import os
from pathlib import Path
from urllib.parse import urljoin

from selectolax.lexbor import LexborHTMLParser

import crawlq
from crawlq.crawl import Response
from crawlq.pipeline import Pipeline, Record, StoredResponse
from crawlq.types import JSON

DATA = Path(os.environ.get("DISCOVERY_DATA", "discovery-data"))

app = crawlq.App(f"sqlite:///{DATA / 'queue.db'}")
app.limit("*", concurrency=2, interval=0.1)  # per host
pipeline = Pipeline(app, data=DATA)


@app.task(start=True)
async def seed(ctx: crawlq.Context, url: str) -> None:
    await ctx.schedule(download, url)


@pipeline.fetch(seen=True)  # a document already fetched is never scheduled again
async def download(ctx: crawlq.Context, url: str) -> Response | None:
    response = await ctx.fetch(url)
    return response if response.status == 200 and response.is_html else None


@pipeline.stage()
def parse(ctx: crawlq.SyncContext, stored: StoredResponse) -> list[Record]:
    page = LexborHTMLParser(stored.text())
    title = page.css_first("title")
    found = {
        urljoin(stored.url, a.attributes.get("href") or "").split("#")[0] for a in page.css("a")
    }
    links = sorted(link for link in found if link.startswith(("http://", "https://")))
    ctx.schedule_many(download, links, only_if_new=True)  # scheduled as found
    data: dict[str, JSON] = {
        "title": title.text(strip=True) if title else "",
        "references": len(links),
    }
    return [Record(type="document", key=stored.url, data=data)]
