"""What a running task sees: its element, its attempt, a way to schedule follow-up work, and
the worker's shared fetcher (`ctx.fetch(url)`: robots.txt, Retry-After and backoff applied)
and headless browser (`ctx.render(url)`: every request of the page fetched the same way)."""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from .observe.logs import logger, safe_key
from .types import JSON, Claimed, Schedule, ScheduleResult

if TYPE_CHECKING:
    from .app import App, Target
    from .backends import Backend
    from .crawl.browser import Browser, Rendered
    from .crawl.fetcher import Fetcher
    from .crawl.politeness import Politeness
    from .crawl.response import Response

FETCHER = "crawlq.fetcher"
POLITENESS = "crawlq.politeness"
BROWSER = "crawlq.browser"


class Context:
    """Handed to async tasks; `ctx.sync` is the blocking twin handed to sync tasks."""

    def __init__(self, app: App, backend: Backend, claimed: Claimed, element: JSON) -> None:
        self.app = app
        self.element = element
        self.queue = claimed.queue
        self.key = claimed.key
        self.group = claimed.group
        self.attempt = claimed.attempt
        self.due = claimed.due  # when the element was due (a retry's due time on a retry)
        self.claimed_at = claimed.claimed_at
        self._backend = backend
        self._loop = asyncio.get_running_loop()
        #: follow-up work the worker writes just before this task's ack (`schedule_with_ack`)
        self.with_ack: list[Schedule] = []

    # made on first use: most tasks log nothing, and only sync tasks need `sync`
    @functools.cached_property
    def log(self) -> logging.LoggerAdapter[logging.Logger]:
        return logging.LoggerAdapter(
            logger(f"crawlq.task.{self.queue}"),
            {"queue": self.queue, "key": safe_key(self.key), "attempt": self.attempt},
        )

    @functools.cached_property
    def sync(self) -> SyncContext:
        return SyncContext(self)

    async def schedule(
        self,
        target: Target,
        element: JSON,
        *,
        seconds: float = 0,
        priority: int = 0,
        **options: Any,
    ) -> ScheduleResult:
        """Schedules follow-up work (a link found, the next stage) on the worker's backend."""
        return await self.app.aschedule_many(
            target, [element], seconds=seconds, priority=priority, backend=self._backend, **options
        )

    async def schedule_many(
        self,
        target: Target,
        elements: Iterable[JSON],
        *,
        seconds: float = 0,
        priority: int = 0,
        **options: Any,
    ) -> ScheduleResult:
        return await self.app.aschedule_many(
            target, elements, seconds=seconds, priority=priority, backend=self._backend, **options
        )

    async def schedule_with_ack(
        self, target: Target, elements: Iterable[JSON], **options: Any
    ) -> None:
        """Schedules follow-up work once this task succeeds: the worker writes it in one batch
        with other tasks' follow-ups, just before their acks (so a crash in between runs the
        task again, never loses the work). Nothing is scheduled if the task fails."""
        self.with_ack += await self.app.prepare(target, elements, backend=self._backend, **options)

    @property
    def backend(self) -> Backend:
        return self._backend

    @property
    def fetcher(self) -> Fetcher:
        """The worker's fetcher: `app.provide("crawlq.fetcher", ...)` configures it."""
        fetcher: Fetcher = self.app.shared(FETCHER, _default_fetcher)
        return fetcher

    @property
    def politeness(self) -> Politeness:
        backend = self._backend
        politeness: Politeness = self.app.shared(POLITENESS, lambda: _politeness(backend))
        return politeness

    async def fetch(self, url: str, **options: Any) -> Response:
        """Fetches `url` with the shared fetcher: robots.txt obeyed, Crawl-delay raising the
        group's interval, 429/503 Retry-After blocking the group (raises `Throttled`),
        repeated failures backing it off. The element's own URL counts against its group."""
        from .grouping import element_url

        group = self.group if url == element_url(self.element) else None
        return await self.politeness.fetch(self.fetcher, url, group=group, **options)

    @property
    def browser(self) -> Browser:
        """The worker's headless Chromium: `app.provide("crawlq.browser", ...)` configures it
        (a `crawlq.crawl.browser.Browser`); needs Playwright (the `browser` extra)."""
        browser: Browser = self.app.shared(BROWSER, _default_browser)
        return browser

    async def render(
        self,
        url: str,
        *,
        wait_for: str | None = None,
        scope: Callable[[str], Any] | None = None,
        **options: Any,
    ) -> Rendered:
        """`fetch`es `url`, then, if it is HTML with a 2xx status, renders it in the worker's
        headless Chromium: every request the page makes (scripts, XHR, stylesheets) is
        fetched by the same fetcher with the same politeness, each counting against its own
        host's group, and `scope` (a hop check raising FetchError) applies to each. Waits
        for the browser setting's `wait_until`, then for `wait_for` (a CSS selector) if
        given. `Rendered.html` is the rendered DOM; the document's own response is
        `Rendered.response`. Raises FetchError as `fetch` does, and for the browser itself
        (BROWSER_UNAVAILABLE, BROWSER_FAILED, TIMEOUT)."""
        from .crawl.browser import polite_fetch

        response = await self.fetch(url, scope=scope, **options)
        resources = polite_fetch(
            self.politeness, self.fetcher, scope=scope, robots=options.get("robots")
        )
        return await self.browser.render(
            response,
            resources,
            wait_for=wait_for,
            user_agent=self.fetcher.settings.user_agent,
            max_bytes=self.fetcher.settings.max_bytes,
        )


class SyncContext:
    """The same context for sync tasks running in the worker's thread pool."""

    def __init__(self, ctx: Context) -> None:
        self._ctx = ctx
        self.app = ctx.app
        self.element = ctx.element
        self.queue = ctx.queue
        self.key = ctx.key
        self.group = ctx.group
        self.attempt = ctx.attempt
        self.claimed_at = ctx.claimed_at
        self.log = ctx.log

    def schedule(
        self,
        target: Target,
        element: JSON,
        *,
        seconds: float = 0,
        priority: int = 0,
        **options: Any,
    ) -> ScheduleResult:
        coro = self._ctx.schedule(target, element, seconds=seconds, priority=priority, **options)
        return asyncio.run_coroutine_threadsafe(coro, self._ctx._loop).result()

    def schedule_many(
        self,
        target: Target,
        elements: Iterable[JSON],
        *,
        seconds: float = 0,
        priority: int = 0,
        **options: Any,
    ) -> ScheduleResult:
        coro = self._ctx.schedule_many(
            target, elements, seconds=seconds, priority=priority, **options
        )
        return asyncio.run_coroutine_threadsafe(coro, self._ctx._loop).result()

    def fetch(self, url: str, **options: Any) -> Response:
        """`Context.fetch` for sync tasks: blocks this thread, not the worker's loop."""
        coro = self._ctx.fetch(url, **options)
        return asyncio.run_coroutine_threadsafe(coro, self._ctx._loop).result()

    def render(self, url: str, **options: Any) -> Rendered:
        """`Context.render` for sync tasks: blocks this thread, not the worker's loop."""
        coro = self._ctx.render(url, **options)
        return asyncio.run_coroutine_threadsafe(coro, self._ctx._loop).result()


# The crawler is imported when first needed, not for each task that asks (nor by workers that
# never fetch).


def _default_fetcher() -> Fetcher:
    from .crawl.fetcher import Fetcher

    return Fetcher()


def _default_browser() -> Browser:
    from .crawl.browser import Browser

    return Browser()


def _politeness(backend: Backend) -> Politeness:
    from .crawl.politeness import Politeness

    return Politeness(backend)
