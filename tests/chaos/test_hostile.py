"""The fetcher and a whole crawl against a hostile server (crawlq.testing.hostile): for every
way a server can misbehave, time is bounded by the timeouts, memory by max_bytes (decoded
size included), the failure is recorded with a specific reason, the connection pool is not
poisoned, and the worker survives to the end of the crawl."""

from __future__ import annotations

import time
import tracemalloc
from collections import defaultdict
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from crawlq.crawl.crawler import PAGES_FILE, WARC_DIR, Crawl, CrawlSettings
from crawlq.crawl.errors import TRANSIENT, FetchError, Reason
from crawlq.crawl.fetcher import Fetcher
from crawlq.crawl.politeness import Backoff
from crawlq.crawl.records import read_records
from crawlq.crawl.response import Response
from crawlq.crawl.scope import Scope
from crawlq.crawl.settings import FetchSettings, Timeouts
from crawlq.crawl.store import WarcStore
from crawlq.retry import Retry
from crawlq.testing.hostile import EXPECTED, HostileServer

TIMEOUTS = Timeouts(connect=2, read=1, total=2)
MAX_BYTES = 1 << 20
#: Slack on top of a timeout for a loaded 2-core machine.
SLACK = 1.5


@pytest.fixture
async def server() -> AsyncIterator[HostileServer]:
    async with HostileServer(bomb_bytes=64 << 20, drip=0.05, hop_delay=0.5) as hostile:
        yield hostile


def settings_for(server: HostileServer, **options: Any) -> FetchSettings:
    options.setdefault("timeouts", TIMEOUTS)
    options.setdefault("max_bytes", MAX_BYTES)
    return FetchSettings(
        resolve=server.resolve,
        resolve_only=True,
        allow_networks=("127.0.0.0/8",),
        ca_file=server.ca_file,
        **options,
    )


async def outcome(fetcher: Fetcher, url: str) -> tuple[Reason | None, str, Response | None]:
    """The reason a page fails with (reading its text included), its detail, its response."""
    try:
        response = await fetcher.fetch(url)
    except FetchError as exc:
        return exc.reason, exc.detail, None
    try:
        response.text()
    except FetchError as exc:
        return exc.reason, exc.detail, response
    return None, "", response


DETAILS = {
    "slow-drip": "total timeout",
    "slowloris": "total timeout",
    "stall": "reading data",
    "slow-redirect": "left after the redirects",
    "endless": f"body over {MAX_BYTES} bytes",
    "huge-length": "Content-Length 1000000000000000",
    "gzip-bomb": f"decoded body over {MAX_BYTES} bytes",
    "deflate-bomb": f"decoded body over {MAX_BYTES} bytes",
    "gzip-gzip-bomb": f"decoded body over {MAX_BYTES} bytes",
    "chunked-gzip-bomb": f"decoded body over {MAX_BYTES} bytes",
    "br-bomb": f"decoded body over {MAX_BYTES} bytes",
    "bad-status": "Invalid status code",
    "garbage": "Bad status line",
    "bad-length": "Content-Length",
    "bad-chunk": "chunk size",
    "short-body": "received 1006 of 100000 bytes",
    "long-body": "poisoned",
    "binary-html": "no charset declared and none detected",
    "huge-header": "Got more than 8190 bytes",
    "many-headers": "Too many headers",
    "empty": "closed the connection",
    "bad-location": "redirect to an invalid URL",
    "file-location": "not http(s): 'file:///etc/passwd'",
    "tls-untrusted": "unable to get local issuer certificate",
    "tls-expired": "certificate has expired",
    "tls-wrong-host": "Hostname mismatch",
    "tls-plain": "WRONG_VERSION_NUMBER",
}


@pytest.mark.parametrize("kind", sorted(EXPECTED))
async def test_each_hostile_kind_is_bounded_in_time_and_named_by_its_reason(
    server: HostileServer, kind: str
) -> None:
    assert kind in server.kinds
    async with Fetcher(settings_for(server)) as fetcher:
        started = time.monotonic()
        reason, detail, response = await outcome(fetcher, server.url(kind, 1))
        elapsed = time.monotonic() - started
        # The connection pool is not poisoned: the next page of the host is its own.
        after = await fetcher.fetch(server.url("ok", 2))
    assert reason is EXPECTED[kind], (kind, reason, detail)
    assert DETAILS.get(kind, "") in detail, detail
    # robots.txt and the page each get the total timeout at most.
    assert elapsed < 2 * TIMEOUTS.total + SLACK, elapsed
    if response is not None:
        assert len(response.body) <= MAX_BYTES and len(response.raw) <= MAX_BYTES
    assert after.status == 200 and after.body.endswith(b"<body>/ok/2</body></html>")


async def test_a_redirect_chain_shares_one_total_timeout(server: HostileServer) -> None:
    """Ten slow hops, each within the read timeout: the chain stops at the total timeout,
    not at ten of them."""
    async with Fetcher(settings_for(server, robots=False)) as fetcher:
        started = time.monotonic()
        with pytest.raises(FetchError) as caught:
            await fetcher.fetch(server.url("slow-redirect", 3))
        elapsed = time.monotonic() - started
    assert caught.value.reason is Reason.TIMEOUT
    assert 1 <= len(caught.value.responses) <= 4  # 0.5 s a hop, 2 s in all
    assert elapsed < TIMEOUTS.total + SLACK


@pytest.mark.parametrize(
    "kind", ["gzip-bomb", "deflate-bomb", "gzip-gzip-bomb", "chunked-gzip-bomb", "endless"]
)
async def test_bombs_and_endless_bodies_never_take_more_memory_than_max_bytes(
    server: HostileServer, kind: str
) -> None:
    """A 64 MiB bomb against a 1 MiB cap: the fetch allocates a few times the cap at most
    (the compressed body, the decoded one, their buffers), never the bomb."""
    async with Fetcher(settings_for(server, robots=False)) as fetcher:
        await fetcher.fetch(server.url("ok", 1))  # the connection and its buffers, first
        tracemalloc.start()
        try:
            with pytest.raises(FetchError) as caught:
                await fetcher.fetch(server.url(kind, 1))
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
    assert caught.value.reason is Reason.TOO_LARGE
    assert peak < 4 * MAX_BYTES, f"{kind}: {peak / 2**20:.1f} MiB at the peak"


async def test_a_whole_crawl_of_hostile_pages_records_every_page_and_the_worker_survives(
    server: HostileServer, tmp_path: Path
) -> None:
    kinds = [kind for kind in server.kinds if kind != "ok"]
    pages = [server.url(kind, n) for kind in kinds for n in range(2)]
    server.links = pages
    seed = server.url("index", 0)
    crawl = Crawl(
        CrawlSettings(
            out=tmp_path,
            fetch=settings_for(server),
            scope=Scope(domains=(server.name,)),
            concurrency_per_domain=len(pages),
            retry=Retry(max_attempts=2, base=0.05, factor=1, jitter=0),
            backoff=Backoff(after=1000),
        )
    )
    started = time.monotonic()
    stats = await crawl.run([seed], concurrency=len(pages) + 1)
    elapsed = time.monotonic() - started
    records: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for record in read_records(tmp_path / PAGES_FILE):
        records[str(record["url"])].append(record)
    assert sorted(records) == sorted([seed, *pages])
    for kind in kinds:
        for n in range(2):
            final = records[server.url(kind, n)][-1]
            expected = EXPECTED[kind]
            assert final["error"] == (expected.value if expected else None), (kind, final)
            assert final["retry"] is False
    # A page failing for a transient reason is retried, then dead-lettered. (A stall on a
    # loaded machine may time out any page's first try: it is retried, and ends by its kind.)
    retried = {url for url in pages if any(r["retry"] for r in records[url])}
    dying = {server.url(k, n) for k in kinds for n in range(2) if EXPECTED[k] in TRANSIENT}
    assert stats.done + stats.dead == len(pages) + 1  # every page ended, none lost
    assert stats.dead == len(dying) > 0 and dying <= retried
    assert elapsed < 60
    store = WarcStore(tmp_path / WARC_DIR)
    odd = await store.get(server.url("odd-headers", 0))
    await store.aclose()
    assert odd is not None and odd.status == 200
    # A reason phrase and headers in Latin-1 once failed the WARC batch they were written in
    # (and with it every page of the batch): now stored, %-escaped, WARC headers being ASCII.
    assert odd.header("X-Latin") == "caf%E9 %FF%FE"
    assert odd.header("Set-Cookie") == "weird=[redacted]; Path=/"  # a credential, maybe
