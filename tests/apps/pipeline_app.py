"""The pipeline `tests/test_pipeline_processes.py` drives through real `crawlq` processes.

Its backend URL comes from CRAWLQ_BACKEND, its data folder from PIPE_DATA. Nothing goes on
the network: `download` makes each page from its URL.

    download   a page of three lines (`<url> line <n>`); PIPE_MOVED=`old new`: `old` redirects
               (301) to `new`
    parse      one `line` record per line of the page, noting PIPE_VERSION (its "code")
    total      one `total` record per page: how many lines parse wrote, and their version

PIPE_HOLD=`stage:ref` holds that stage on that input, PIPE_HOLD=`export` an export after its
first record, PIPE_HOLD=`sync` a worker when it puts its tasks' outputs on disk before it
records them done: it writes its pid to `held` in PIPE_DATA, then waits until killed. The
test SIGKILLs it there, at a point it chose rather than at a time.
"""

from __future__ import annotations

import dataclasses
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import crawlq
from crawlq.crawl.response import Response
from crawlq.pipeline import Pipeline, Record, StoredResponse
from crawlq.results import ResultsStore
from crawlq.types import JSON

DATA = Path(os.environ["PIPE_DATA"])
HOLD = os.environ.get("PIPE_HOLD", "")
VERSION = os.environ.get("PIPE_VERSION", "1")

app = crawlq.App(os.environ["CRAWLQ_BACKEND"])
pipeline = Pipeline(app, data=DATA)
#: Short, so that what a killed process held comes back soon; long enough for a loaded machine.
LEASE = 5.0
fast = crawlq.Retry(max_attempts=3, base=0.01, cap=0.01, jitter=0)


def held(what: str) -> None:
    """Waits for good if PIPE_HOLD names `what`, once the test can see it does."""
    if what == HOLD:
        (DATA / "held.tmp").write_text(str(os.getpid()))
        (DATA / "held.tmp").rename(DATA / "held")
        threading.Event().wait()


class HeldStore(ResultsStore):
    """A results store whose export stops after the first record (PIPE_HOLD=export)."""

    def rows(
        self, type_: str, *, ref: str | None = None, stage: str | None = None
    ) -> Iterator[dict[str, Any]]:
        for n, row in enumerate(super().rows(type_, ref=ref, stage=stage)):
            if n == 1:
                held("export")
            yield row


pipeline.results = HeldStore(pipeline.results.path)


class HeldSync:
    """A resource the worker syncs with the pipeline's (PIPE_HOLD=sync holds there)."""

    async def sync(self) -> None:
        held("sync")


app.provide("held", HeldSync)


@pipeline.fetch(retry=fast, lease=LEASE)
async def download(ctx: crawlq.Context, url: str) -> Response:
    ctx.app.shared("held")
    moved = dict([os.environ.get("PIPE_MOVED", " ").split(" ")])
    if url in moved:
        return dataclasses.replace(page(moved[url]), history=(page(url, moved[url]),))
    return page(url)


def page(url: str, moved: str | None = None) -> Response:
    body = b"" if moved else "".join(f"{url} line {n}\n" for n in range(3)).encode()
    return Response(
        url=url,
        status=301 if moved else 200,
        reason="Moved" if moved else "OK",
        http_version="HTTP/1.1",
        headers=(("Location", moved),) if moved else (("Content-Type", "text/plain"),),
        raw=body,
        body=body,
        fetched_at=time.time(),
        elapsed=0.0,
    )


@pipeline.stage(retry=fast, lease=LEASE)
def parse(ctx: crawlq.SyncContext, stored: StoredResponse) -> list[Record]:
    held(f"parse:{stored.url}")
    lines = stored.body.decode().splitlines()
    return [
        Record(type="line", key=f"{stored.url}#{n}", data={"text": text, "version": VERSION})
        for n, text in enumerate(lines)
    ]


@pipeline.stage(retry=fast, lease=LEASE)
def total(ctx: crawlq.SyncContext, lines: list[Record]) -> Record:
    versions: list[JSON] = [*sorted({str(r.data["version"]) for r in lines})]
    return Record(
        type="total", key=str(ctx.element), data={"lines": len(lines), "versions": versions}
    )
