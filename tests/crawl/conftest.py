"""Fixtures of the crawler tests: settings that can only reach the synthetic web."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from crawlq.crawl import page_reader
from crawlq.crawl.crawler import CrawlSettings
from crawlq.crawl.politeness import Backoff
from crawlq.crawl.scope import Scope
from crawlq.crawl.settings import FetchSettings, Timeouts
from crawlq.crawl.testing import SyntheticWeb
from crawlq.retry import Retry

#: Retries that do not slow a test down: 3 tries, 50 ms apart.
FAST_RETRY = Retry(max_attempts=3, base=0.05, factor=1, jitter=0)


def fetch_settings(net: SyntheticWeb, **options: Any) -> FetchSettings:
    """Only the synthetic web's names resolve: a test can never reach a public address."""
    options.setdefault("timeouts", Timeouts(connect=5, read=5, total=10))
    options.setdefault("resolve", net.resolve)
    options.setdefault("allow_networks", ("127.0.0.0/8",))
    options.setdefault("robots_retry", 0.2)  # an unreachable site pauses 60 s by default
    return FetchSettings(resolve_only=True, **options)


def crawl_settings(net: SyntheticWeb, out: Path, **options: Any) -> CrawlSettings:
    fetch = options.pop("fetch", None) or fetch_settings(net)
    options.setdefault("scope", Scope(domains=tuple(net.sites)))
    options.setdefault("retry", FAST_RETRY)
    options.setdefault("backoff", Backoff(after=100))
    return CrawlSettings(out=out, fetch=fetch, **options)


def started_children(monkeypatch: pytest.MonkeyPatch) -> list[asyncio.subprocess.Process]:
    """The processes page readers start to read pages, as they start them."""
    started: list[asyncio.subprocess.Process] = []
    start = page_reader._Child.start

    async def counted(timeout: float) -> page_reader._Child:
        child = await start(timeout)
        started.append(child.process)
        return child

    monkeypatch.setattr(page_reader._Child, "start", counted)
    return started
