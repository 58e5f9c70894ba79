"""The pipeline `tests/test_pipeline_moved_keys.py` drives through real `crawlq` processes.

Its backend URL comes from CRAWLQ_BACKEND, its data folder from PIPE_DATA. Nothing goes on
the network: `download` makes each page from its URL.

    download   a page of three lines (`<url> line <n>`)
    parse      one `line` record per line (key `<url>#<n>`), noting PIPE_VERSION (its "code")
               and the page that emitted it; PIPE_MOVE=`key page`: that line's record comes
               from `page` instead of the page it is a line of (new code that finds it there)
    total      one `total` record per page: how many line records parse wrote for it

PIPE_HOLD=`parse:<url>` holds parse on that page: it writes its pid to `held` in PIPE_DATA,
then waits until killed. The test SIGKILLs it there, at a point it chose, not at a time.
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import crawlq
from crawlq.crawl.response import Response
from crawlq.pipeline import Pipeline, Record, StoredResponse

DATA = Path(os.environ["PIPE_DATA"])
HOLD = os.environ.get("PIPE_HOLD", "")
VERSION = os.environ.get("PIPE_VERSION", "1")
MOVED_KEY, _, MOVED_TO = os.environ.get("PIPE_MOVE", "").partition(" ")

app = crawlq.App(os.environ["CRAWLQ_BACKEND"])
pipeline = Pipeline(app, data=DATA)
fast = crawlq.Retry(max_attempts=2, base=0.01, cap=0.01, jitter=0)
LEASE = 5.0


def held(what: str) -> None:
    """Waits for good if PIPE_HOLD names `what`, once the test can see it does."""
    if what == HOLD:
        (DATA / "held.tmp").write_text(str(os.getpid()))
        (DATA / "held.tmp").rename(DATA / "held")
        threading.Event().wait()


@pipeline.fetch(retry=fast, lease=LEASE)
async def download(ctx: crawlq.Context, url: str) -> Response:
    body = "".join(f"{url} line {n}\n" for n in range(3)).encode()
    return Response(
        url=url,
        status=200,
        reason="OK",
        http_version="HTTP/1.1",
        headers=(("Content-Type", "text/plain"),),
        raw=body,
        body=body,
        fetched_at=time.time(),
        elapsed=0.0,
    )


@pipeline.stage(retry=fast, lease=LEASE)
def parse(ctx: crawlq.SyncContext, stored: StoredResponse) -> list[Record]:
    held(f"parse:{stored.url}")
    found = {f"{stored.url}#{n}": text for n, text in enumerate(stored.body.decode().splitlines())}
    found.pop(MOVED_KEY, None)
    if stored.url == MOVED_TO:
        found[MOVED_KEY] = "moved here"
    return [
        Record(type="line", key=key, data={"text": text, "version": VERSION, "page": stored.url})
        for key, text in found.items()
    ]


@pipeline.stage(retry=fast, lease=LEASE)
def total(ctx: crawlq.SyncContext, lines: list[Record]) -> Record:
    return Record(type="total", key=str(ctx.element), data={"lines": len(lines)})
