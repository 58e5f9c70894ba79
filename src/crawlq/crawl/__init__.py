"""The crawler: a shared, polite fetcher; robots.txt; server-side politeness pushed into the
queue; links and scope; WARC storage with an index; and the crawl task of `crawlq crawl`.

    fetcher.py     Fetcher, Session, Login: pooled client, redirects hop by hop, proxies
    proxies.py     the turn of the egress proxies, leaving out those that cannot be reached
    browser.py     Browser: headless Chromium rendering, every request through the fetcher
    robots.py      robots.txt per origin, cached
    politeness.py  Crawl-delay, Retry-After and backoff as the queue's limits and blocks
    urls.py, links.py, scope.py    canonical URLs, link extraction, what a crawl may visit
    warc.py, store.py              WARC files rotated by size; the content store and index
    crawler.py     the crawl task; records.py, budget.py, progress.py its bookkeeping
    page_reader.py links read on the loop, in threads, or in child processes (page_child.py)
"""

from .browser import Browser, BrowserSettings, Rendered
from .crawler import Crawl, CrawlSettings
from .errors import FetchError, Reason, Throttled
from .fetcher import Fetcher, Login, Session
from .politeness import Backoff, Politeness
from .response import Response
from .scope import Scope
from .settings import FetchSettings, Timeouts
from .store import ContentStore, WarcStore

__all__ = [
    "Backoff",
    "Browser",
    "BrowserSettings",
    "ContentStore",
    "Crawl",
    "CrawlSettings",
    "FetchError",
    "FetchSettings",
    "Fetcher",
    "Login",
    "Politeness",
    "Reason",
    "Rendered",
    "Response",
    "Scope",
    "Session",
    "Throttled",
    "Timeouts",
    "WarcStore",
]
