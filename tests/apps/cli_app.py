"""The job `tests/test_cli.py` drives through the real `crawlq` command.

Its backend URL comes from the environment (CRAWLQ_BACKEND), set by each test to a SQLite
file in its own tmp_path. Every task run appends one line, "<pid> <what ran>", to the file
named by CRAWLQ_TEST_RECORD, so a test can check what ran, how many times, and in which
process.

    seed       start=True, no group: schedules PAGES URLs on three hosts and one `explode`
    fetch      async, grouped by host, seen=True: records the URL, schedules `normalize` for it
    normalize  sync (thread pool), no group: records the page it normalizes
    explode    async, always raises: dead after 2 attempts, retried after ~0.01 s
"""

from __future__ import annotations

import os
from typing import Any

import crawlq

#: How many URLs `seed` schedules; CRAWLQ_TEST_PAGES overrides it.
PAGES = int(os.environ.get("CRAWLQ_TEST_PAGES", "12"))
HOSTS = ("a.example.test", "b.example.test", "c.example.test")

app = crawlq.App(os.environ["CRAWLQ_BACKEND"])
app.limit("*.example.test", concurrency=2)


def page_url(n: int) -> str:
    return f"http://{HOSTS[n % len(HOSTS)]}/page/{n}"


def record(line: str) -> None:
    """Appends one line; O_APPEND keeps lines whole across worker processes."""
    fd = os.open(os.environ["CRAWLQ_TEST_RECORD"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, f"{os.getpid()} {line}\n".encode())
    finally:
        os.close(fd)


@app.task(start=True)
async def seed(ctx: crawlq.Context, element: Any) -> None:
    record(f"seed {element}")
    await ctx.schedule_many(fetch, [page_url(n) for n in range(PAGES)])
    await ctx.schedule(explode, {"boom": 1})


@app.task(seen=True)
async def fetch(ctx: crawlq.Context, url: str) -> None:
    record(f"fetch {url}")
    await ctx.schedule(normalize, {"page": url})


@app.task(group=None)
def normalize(ctx: crawlq.SyncContext, element: dict[str, str]) -> None:
    record(f"normalize {element['page']}")


@app.task(retry=crawlq.Retry(max_attempts=2, base=0.01))
async def explode(ctx: crawlq.Context, element: Any) -> None:
    record(f"explode {ctx.key} attempt {ctx.attempt}")
    raise RuntimeError(f"always fails: {element}")
