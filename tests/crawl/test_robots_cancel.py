"""robots.txt shared by the tasks that ask for it at once: one task cancelled while it
fetches for all of them leaves the others their answer."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import pytest
from aiohttp import web

from crawlq.crawl.errors import FetchError, Reason
from crawlq.crawl.fetcher import Fetcher
from crawlq.crawl.settings import FetchSettings, Timeouts


@dataclass
class SlowRobots:
    """A site on 127.0.0.1 whose robots.txt is answered only once `release` is set."""

    url: str = ""
    release: asyncio.Event = field(default_factory=asyncio.Event)
    asked: asyncio.Event = field(default_factory=asyncio.Event)
    requests: int = 0

    async def robots(self, request: web.Request) -> web.Response:
        self.requests += 1
        self.asked.set()
        await self.release.wait()
        return web.Response(text="User-agent: *\nDisallow: /private\n")


@pytest.fixture
async def site() -> AsyncIterator[SlowRobots]:
    site = SlowRobots()
    app = web.Application()
    app.router.add_get("/robots.txt", site.robots)
    runner = web.AppRunner(app)
    await runner.setup()
    server = web.TCPSite(runner, "127.0.0.1", 0)
    await server.start()
    port = runner.addresses[0][1]
    site.url = f"http://127.0.0.1:{port}"
    yield site
    site.release.set()
    await runner.cleanup()


async def test_a_cancelled_task_fetching_robots_txt_leaves_the_waiting_ones_their_answer(
    site: SlowRobots,
) -> None:
    settings = FetchSettings(
        allow_networks=("127.0.0.0/8",), timeouts=Timeouts(connect=5, read=5, total=10)
    )
    async with Fetcher(settings) as fetcher:
        # Both start in the same turn: the first fetches robots.txt, the second waits for it.
        fetching = asyncio.create_task(fetcher.robots.check(f"{site.url}/page"))
        waiting = asyncio.create_task(fetcher.robots.check(f"{site.url}/private/page"))
        await site.asked.wait()
        fetching.cancel()
        await asyncio.wait([fetching])
        site.release.set()
        with pytest.raises(FetchError) as refused:
            await waiting
    assert fetching.cancelled()
    assert refused.value.reason is Reason.ROBOTS_DISALLOWED
    assert site.requests == 2  # the waiting task asked again itself
