"""The app the dashboard tests run with `crawlq worker tests.dashboard.board_app:app`.

`pages`: a URL fails while the file CRAWLQ_TEST_HEAL is missing if its path starts with
/fail/ (one attempt, so it goes straight to the dead letters), and is done otherwise.
`held`: runs until the file CRAWLQ_TEST_RELEASE exists, so tests see elements in flight.
Every finished element appends one JSON line to CRAWLQ_TEST_RECORD.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
from pathlib import Path
from typing import Any

import crawlq

app = crawlq.App(os.environ["CRAWLQ_BACKEND"])
app.limit("*", concurrency=8)
log = logging.getLogger("tests.board_app")
_record = os.open(os.environ["CRAWLQ_TEST_RECORD"], os.O_WRONLY | os.O_APPEND | os.O_CREAT)
_heal = Path(os.environ["CRAWLQ_TEST_HEAL"])
_release = Path(os.environ["CRAWLQ_TEST_RELEASE"])


def record(queue: str, element: Any) -> None:
    os.write(_record, (json.dumps({"queue": queue, "element": element}) + "\n").encode())


@app.task(max_attempts=1)
async def pages(ctx: crawlq.Context, url: str) -> None:
    log.info("fetching %s", url)
    if "/fail/" in url and not _heal.exists():
        raise RuntimeError(f"simulated failure of {url}")
    record("pages", url)


@app.task(group=None)
async def held(ctx: crawlq.Context, n: int) -> None:
    while not _release.exists():
        await asyncio.sleep(0.05)
    record("held", n)
