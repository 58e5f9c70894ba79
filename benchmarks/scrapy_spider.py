"""The Scrapy side of benchmarks/crawl_bench.py: the same crawl as `crawlq crawl`, politely.

    python -m benchmarks.scrapy_spider SPEC.json

SPEC holds the seeds, the name -> loopback address map, the per-domain limits and the
output folder. Names resolve through `StaticResolver`, which knows only the synthetic
sites: nothing else can be reached. Items go to a JSON lines feed; the scheduler keeps its
memory queues (no JOBDIR, so no disk queues).

Scrapy is imported inside the functions: the bench extra brings it, CI does not have it.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any


def settings(spec: dict[str, Any]) -> dict[str, Any]:
    out = Path(spec["out"])
    return {
        "BOT_NAME": "scrapy-bench",
        "ROBOTSTXT_OBEY": True,
        "CONCURRENT_REQUESTS": spec["concurrency"],
        "CONCURRENT_REQUESTS_PER_DOMAIN": spec["per_domain"],
        "DOWNLOAD_DELAY": spec["delay"],
        "RANDOMIZE_DOWNLOAD_DELAY": False,
        "AUTOTHROTTLE_ENABLED": False,
        "HTTPCACHE_ENABLED": False,
        "COOKIES_ENABLED": True,
        "RETRY_ENABLED": True,
        "RETRY_TIMES": 3,  # 4 tries, as crawlq's --max-attempts 4
        "DOWNLOAD_TIMEOUT": 30,
        "LOG_LEVEL": "INFO",
        "TELNETCONSOLE_ENABLED": False,
        "REMOTE_CONTROL_ENABLED": False,
        # Scrapy's advice for broad crawls: spread the requests over the domains' slots.
        "SCHEDULER_PRIORITY_QUEUE": "scrapy.pqueues.DownloaderAwarePriorityQueue",
        "TWISTED_DNS_RESOLVER": "benchmarks.scrapy_spider.StaticResolver",
        "STATIC_RESOLVE": spec["resolve"],
        "FEEDS": {str(out / "pages.jsonl"): {"format": "jsonlines"}},
    }


def build_resolver() -> type:
    from twisted.internet import defer
    from twisted.internet.error import DNSLookupError
    from twisted.internet.interfaces import IResolverSimple
    from zope.interface import implementer

    @implementer(IResolverSimple)
    class _StaticResolver:
        """Answers from the STATIC_RESOLVE setting only; every other name fails."""

        def __init__(self, reactor: Any, mapping: dict[str, str]) -> None:
            self.reactor = reactor
            self.mapping = {k.lower(): v for k, v in mapping.items()}

        @classmethod
        def from_crawler(cls, crawler: Any, reactor: Any) -> Any:
            return cls(reactor, dict(crawler.settings.getdict("STATIC_RESOLVE")))

        def install_on_reactor(self) -> None:
            self.reactor.installResolver(self)

        def getHostByName(self, name: str, timeout: Any = ()) -> Any:
            address = self.mapping.get(name.lower().rstrip("."))
            if address is None:
                return defer.fail(DNSLookupError(f"{name} is not a synthetic site"))
            return defer.succeed(address)

    return _StaticResolver


def build_spider(spec: dict[str, Any]) -> type:
    import scrapy

    class SiteSpider(scrapy.Spider):  # type: ignore[misc]
        name = "sites"
        allowed_domains = sorted(spec["resolve"])
        start_urls = spec["seeds"]

        def parse(self, response: Any) -> Iterator[Any]:
            links = response.css("a::attr(href)").getall()
            yield {
                "url": response.url,
                "status": response.status,
                "title": response.css("title::text").get(),
                "links": len(links),
            }
            for href in links:
                yield response.follow(href, callback=self.parse)

    return SiteSpider


_built: dict[str, type] = {}


def __getattr__(name: str) -> Any:
    # Scrapy loads the resolver by its dotted path: built on first use, with Twisted.
    if name == "StaticResolver":
        return _built.setdefault(name, build_resolver())
    raise AttributeError(name)


def main() -> None:
    from scrapy.crawler import CrawlerProcess

    spec = json.loads(Path(sys.argv[1]).read_text())
    process = CrawlerProcess(settings(spec))
    process.crawl(build_spider(spec))
    process.start()


if __name__ == "__main__":
    main()
