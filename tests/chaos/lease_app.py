"""The app of the lease test: `crawlq worker tests.chaos.lease_app:app`.

`step` connects to the test's Unix socket (CHAOS_SOCKET), says its attempt, and waits for a
line back; only then does it do its work (here: record that it did, to CHAOS_RECORD). The
test stops the worker while the task waits and lets the lease run out."""

from __future__ import annotations

import asyncio
import json
import os

import crawlq

app = crawlq.App(os.environ["CRAWLQ_BACKEND"])
_record = os.open(os.environ["CHAOS_RECORD"], os.O_WRONLY | os.O_APPEND | os.O_CREAT)


@app.task(group=None, lease=float(os.environ.get("CHAOS_LEASE", "2")))
async def step(ctx: crawlq.Context, element: str) -> None:
    reader, writer = await asyncio.open_unix_connection(os.environ["CHAOS_SOCKET"])
    writer.write(f"{ctx.attempt}\n".encode())
    await writer.drain()
    await reader.readline()
    os.write(_record, (json.dumps({"element": element, "attempt": ctx.attempt}) + "\n").encode())
    writer.close()
