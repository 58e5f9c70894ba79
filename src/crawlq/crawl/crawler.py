"""A crawl with no user code: seeds in, pages fetched politely, links followed within scope,
every response in WARC files, one JSON line per page outcome.

The crawl's whole state is its queue (in `out/queue.db` unless another backend is given),
its page budget and its files, so a stopped crawl resumes where it left off: seeds are
scheduled "only if new", and the queue's "seen" memory skips what was already fetched.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from ..app import App
from ..backends import Backend
from ..context import BROWSER, FETCHER, POLITENESS, Context
from ..errors import ConfigError
from ..grouping import NO_GROUP, group_of, url_host
from ..retry import Retry
from ..tasks import Task
from ..types import JSON, GroupBy
from ..worker import Worker, WorkerStats
from .browser import Browser, BrowserSettings, Rendered, polite_fetch, require_playwright
from .budget import PageBudget
from .errors import TRANSIENT, FetchError, Reason, Throttled
from .fetcher import Fetcher, Login
from .page_reader import PageReader
from .politeness import Backoff, Politeness, hop_host
from .records import JsonlWriter, PageRecord
from .response import Response
from .robots import refusal
from .scope import Scope
from .settings import FetchSettings
from .store import ContentStore, WarcStore
from .urls import canonicalize, is_canonical
from .warc import DEFAULT_COMPRESS_LEVEL, DEFAULT_FILE_BYTES, RecordRef, Rendition

STORE = "crawlq.crawl.store"
RECORDS = "crawlq.crawl.records"
PAGE_READER = "crawlq.crawl.page_reader"
PAGES_FILE = "pages.jsonl"
#: How many links a process remembers as already in the queue (scheduled, kept or seen).
MAX_KNOWN_LINKS = 100_000
WARC_DIR = "warc"
#: Seeds are scheduled again by a Redis back from a crash for this long after the last were
#: given: one in the first seconds of a crawl loses them (AOF everysec loses about 1 s);
#: later, it has them on disk, and a crawl of a million seeds should not keep each in memory.
SEED_MEMORY = 300.0


@dataclass(frozen=True, kw_only=True, slots=True)
class CrawlSettings:
    """`max_pages` caps the distinct URLs a crawl ever admits (seeds included, over every run
    of it). Errors whose reason is in `retry_reasons` are retried per `retry` and then
    dead-lettered; the others are recorded and the page is done. `render`: each HTML page
    is rendered in a headless Chromium (`browser`) and its links read from the rendered
    DOM; every request the page makes is fetched politely, within the scope's domains (and
    `browser.resource_domains`) and outside its exclude patterns."""

    out: Path
    scope: Scope = field(default_factory=Scope)
    max_pages: int | None = None
    fetch: FetchSettings = field(default_factory=FetchSettings)
    concurrency_per_domain: int = 2
    delay: float = 0.0
    retry: Retry = field(default_factory=lambda: Retry(max_attempts=3, base=5.0))
    retry_reasons: frozenset[Reason] = TRANSIENT
    backoff: Backoff = field(default_factory=Backoff)
    lease: float = 60.0
    max_file_bytes: int = DEFAULT_FILE_BYTES
    warc_level: int = DEFAULT_COMPRESS_LEVEL  # gzip level of the WARC records, 0 to 9
    queue: str = "crawl"
    render: bool = False
    browser: BrowserSettings = field(default_factory=BrowserSettings)

    def __post_init__(self) -> None:
        if self.max_pages is not None and self.max_pages < 1:
            raise ConfigError(f"max_pages must be at least 1, got {self.max_pages}")
        if not 0 <= self.warc_level <= 9:
            raise ConfigError(f"warc_level must be 0 to 9 (gzip's levels), got {self.warc_level}")


@dataclass(kw_only=True)
class CrawlStats:
    """This process's counts, for the progress display."""

    pages: int = 0
    errors: int = 0
    throttled: int = 0
    bytes: int = 0
    started: float = field(default_factory=time.monotonic)


@dataclass(frozen=True, slots=True, kw_only=True)
class _Base:
    url: str
    depth: int
    attempt: int


def page_key(element: Mapping[str, Any]) -> str:
    return str(element["url"])


def page_group(element: JSON) -> str:
    """A page's host, as for any task grouped by host; none for an element that sends no
    request: it takes no turn of its host's interval."""
    if isinstance(element, dict) and _sends_no_request(element):
        return NO_GROUP
    return group_of(element, GroupBy.HOST)


def _sends_no_request(element: Mapping[str, Any]) -> bool:
    """A link robots.txt refused when it was found (recorded as refused), or a URL that a
    page's redirects led to (`fetched_with` that page, and recorded by it)."""
    return bool(element.get("refused") or element.get("fetched_with"))


class _RecordsResource:
    def __init__(self, path: Path) -> None:
        self.writer = JsonlWriter(path)

    async def sync(self) -> None:
        await asyncio.to_thread(self.writer.sync)

    async def aclose(self) -> None:
        self.writer.close()


class Crawl:
    """The crawl task and its resources, on an App of its own."""

    def __init__(
        self,
        settings: CrawlSettings,
        *,
        backend: str | None = None,
        logins: Mapping[str, Login] | None = None,
    ) -> None:
        self.settings = settings
        self.out = Path(settings.out)
        self.out.mkdir(parents=True, exist_ok=True)
        self.logins = dict(logins or {})
        self.stats = CrawlStats()
        self._known = KnownLinks()
        self._seeds: dict[str, JSON] = {}  # by URL: again if the backend may have lost them
        self._seeds_until = 0.0  # monotonic: when `_seeds` are forgotten (SEED_MEMORY)
        self.budget = PageBudget(self.out, settings.max_pages)
        self.app = App(backend or f"sqlite:///{self.out / 'queue.db'}")
        self.app.limit("*", concurrency=settings.concurrency_per_domain, interval=settings.delay)
        self.task: Task[Any] = self.app.task(
            queue=settings.queue,
            key=page_key,
            group=page_group,
            seen=True,
            retry=settings.retry,
            lease=settings.lease,
        )(self.visit)
        self.app.also_publish(self._seed_again)
        self.app.provide(FETCHER, self._fetcher)
        self.app.provide(
            STORE,
            lambda: WarcStore(
                self.out / WARC_DIR,
                max_file_bytes=settings.max_file_bytes,
                compress_level=settings.warc_level,
            ),
        )
        self.app.provide(RECORDS, lambda: _RecordsResource(self.out / PAGES_FILE))
        self.app.provide(PAGE_READER, PageReader)
        if settings.render:
            require_playwright("rendering pages (--render)")
            self.app.provide(BROWSER, lambda: Browser(settings.browser))
        self.resource_scope = _resource_scope(settings.scope, settings.browser)

    def _fetcher(self) -> Fetcher:
        fetcher = Fetcher(self.settings.fetch)
        for domain, login in self.logins.items():
            fetcher.add_login(domain, login)
        return fetcher

    # -- seeding and running ----------------------------------------------------------------

    async def seed(self, urls: Iterable[str]) -> int:
        """Schedules the seeds not yet queued or seen; returns how many were added."""
        seeds: list[str] = []
        for url in urls:
            canonical = canonicalize(url)
            if canonical is None:
                raise FetchError(Reason.OUT_OF_SCOPE, url, "not an absolute http(s) URL")
            if self.settings.scope.refusal(canonical) is None:
                seeds.append(canonical)
        backend = await self.app.backend()  # first: its first use schedules `_seeds` too
        admitted = await self.budget.admit(seeds)
        elements: dict[str, JSON] = {url: {"url": url, "depth": 0} for url in admitted}
        self._seeds.update(elements)  # before the schedule: it may find a restart
        self._seeds_until = time.monotonic() + SEED_MEMORY
        result = await self.app.aschedule_many(
            self.task, list(elements.values()), only_if_new=True, backend=backend
        )
        return result.added

    async def _seed_again(self, backend: Backend) -> None:
        """A Redis back from a crash may have lost the seeds with all that followed (a crash
        in the first seconds of a crawl): they are scheduled again, only if new."""
        self._forget_old_seeds()
        if self._seeds:
            seeds = list(self._seeds.values())
            await self.app.aschedule_many(self.task, seeds, only_if_new=True, backend=backend)

    async def run(
        self,
        seeds: Iterable[str] = (),
        *,
        concurrency: int = 200,
        grace: float = 30.0,
        burst_horizon: float = 300.0,
        worker: Worker | None = None,
    ) -> WorkerStats:
        """Seeds, then works until nothing is left that can start within `burst_horizon`."""
        await self.seed(seeds)
        runner = worker or Worker(
            self.app, burst=True, burst_horizon=burst_horizon, concurrency=concurrency, grace=grace
        )
        try:
            return await runner.run()
        finally:
            await self.aclose()

    async def aclose(self) -> None:
        await self.app.aclose()
        await self.budget.aclose()

    # -- one page ---------------------------------------------------------------------------

    def politeness(self, ctx: Context) -> Politeness:
        backend, backoff = ctx.backend, self.settings.backoff
        politeness: Politeness = ctx.app.shared(
            POLITENESS, lambda: Politeness(backend, backoff=backoff)
        )
        return politeness

    def _forget_old_seeds(self) -> None:
        if self._seeds and time.monotonic() > self._seeds_until:
            self._seeds = {}

    async def visit(self, ctx: Context, element: dict[str, Any]) -> None:
        self._forget_old_seeds()
        url = str(element["url"])
        depth = int(element.get("depth", 0))
        store: ContentStore = ctx.app.shared(STORE)
        records: JsonlWriter = ctx.app.shared(RECORDS).writer
        started = time.monotonic()
        base = _Base(url=url, depth=depth, attempt=ctx.attempt)
        if _sends_no_request(element):
            if element.get("refused"):
                self.stats.errors += 1
                records.write(_error_record(base, refusal(url), None, started, retry=False))
            return
        try:
            response = await self.politeness(ctx).fetch(
                ctx.fetcher, url, group=ctx.group, scope=self._hop_check(url)
            )
            rendered = await self._render(ctx, response)
        except Throttled as exc:
            ref = await _store_all(store, exc.responses)
            self.stats.throttled += 1
            if exc.answered:
                # The server answered 429/503: an attempt, as an error is, or a host that
                # refuses for good would have the page back forever (its group stays blocked
                # in the queue until Retry-After, so the retry waits for that too).
                retry_left = not self.settings.retry.exhausted(ctx.attempt)
                records.write(_error_record(base, exc, ref, started, retry=retry_left))
                raise
            # Held back before sending: no attempt spent.
            await ctx.schedule(
                self.task, element, seconds=max(0.0, exc.until - time.time()), revisit=True
            )
            records.write(_error_record(base, exc, ref, started, retry=True))
            return
        except FetchError as exc:
            ref = await _store_all(store, exc.responses)
            if exc.reason is Reason.OTHER_HOST:
                redirects = int(element.get("redirects", 0)) + len(exc.responses)
                limit = ctx.fetcher.settings.max_redirects
                if redirects > limit:  # the chain so far, over every host it crossed
                    exc = FetchError(
                        Reason.TOO_MANY_REDIRECTS,
                        url,
                        f"more than {limit} redirects",
                        responses=exc.responses,
                    )
                    self.stats.errors += 1
                    records.write(_error_record(base, exc, ref, started, retry=False))
                    return
                if len(exc.responses) > 1:  # hops on its own host on the way: fetched
                    await self._mark_fetched(ctx, url, depth, exc.responses[-1])
                queued = await self._hand_off(ctx, exc.url, depth, redirects)
                self.stats.pages += 1
                record = _error_record(base, exc, ref, started, retry=False)
                records.write(replace(record, error=None, detail=None, links=1, queued=queued))
                return
            retry = exc.reason in self.settings.retry_reasons
            retry_left = retry and not self.settings.retry.exhausted(ctx.attempt)
            self.stats.errors += 1
            records.write(_error_record(base, exc, ref, started, retry=retry_left))
            if retry:
                raise
            return
        ref = await _store_all(store, response.chain)
        self.stats.bytes += len(response.raw)
        if response.status >= 500 and Reason.SERVER_ERROR in self.settings.retry_reasons:
            failure = FetchError(
                Reason.SERVER_ERROR, url, f"HTTP {response.status}", responses=response.chain
            )
            self.stats.errors += 1
            retry_left = not self.settings.retry.exhausted(ctx.attempt)
            records.write(_error_record(base, failure, ref, started, retry=retry_left))
            raise failure
        if response.history:
            await self._mark_fetched(ctx, url, depth, response)
        title, found, dropped, queued = None, 0, 0, 0
        error: FetchError | None = None
        rendition: RecordRef | None = None
        if response.is_html and 200 <= response.status < 300:
            reader: PageReader = ctx.app.shared(PAGE_READER)
            try:
                if rendered is not None and rendered.html is not None:
                    rendition = await store.put_rendition(_rendition(rendered, rendered.html))
                    page = await reader.links(rendered.html, rendered.url)
                else:
                    page = await reader.links(response.text(), response.url)
            except FetchError as exc:
                error = exc
            else:
                title, found, dropped = page.title, len(page.links), page.dropped
                if self.settings.scope.follows(depth) and not page.nofollow:
                    queued = await self._follow(ctx, page.links, depth + 1, {url, response.url})
        self.stats.pages += 1
        if error is not None:
            self.stats.errors += 1
        records.write(
            PageRecord(
                url=url,
                depth=depth,
                attempt=ctx.attempt,
                status=response.status,
                final_url=response.url,
                title=title,
                links=found,
                links_dropped=dropped,
                queued=queued,
                bytes=len(response.body),
                content_type=response.content_type or None,
                fetched_at=response.fetched_at,
                fetch_time=round(time.monotonic() - started, 6),
                redirects=len(response.history),
                error=error.reason.value if error else None,
                detail=error.detail if error else None,
                warc=_ref_text(ref),
                rendered=_ref_text(rendition),
            )
        )

    async def _render(self, ctx: Context, response: Response) -> Rendered | None:
        """The page as a browser renders it, if the crawl renders and it is HTML with a 2xx
        status. Its failures are the page's, with the document among their responses (its
        WARC record kept); a 429/503 its own host answered one of its requests is Throttled,
        as if the page itself had got it."""
        if not self.settings.render:
            return None
        resources = polite_fetch(self.politeness(ctx), ctx.fetcher, scope=self.resource_scope)
        browser: Browser = ctx.app.shared(BROWSER)
        settings = ctx.fetcher.settings
        return await browser.render(
            response, resources, user_agent=settings.user_agent, max_bytes=settings.max_bytes
        )

    def _hop_check(self, url: str) -> Callable[[str], None]:
        """Each hop of `url`'s redirects in scope (Scope.check), and on its host: a hop to
        another host would go out on this host's slot, past the limits of its own (which the
        queue enforces at claim), so it is handed back to the queue (`_hand_off`)."""
        check, host = self.settings.scope.check, url_host(url)

        def check_hop(hop: str) -> None:
            check(hop)
            if hop == url:
                return
            if hop_host(url, hop) != host:
                raise FetchError(Reason.OTHER_HOST, hop, "queued as a page of its own")

        return check_hop

    async def _hand_off(self, ctx: Context, target: str, depth: int, redirects: int) -> int:
        """Queues `target`, where a redirect of a page at `depth` led, as a page of its own:
        1 if it was new. Like a URL a redirect led to, it takes no page of the budget; it
        carries the count of `redirects` that led to it, which the redirect limit bounds
        over every host a chain crosses (or a chain of new URLs bouncing between two hosts
        would go on for ever, past the budget)."""
        known = self._known.of(ctx.backend)
        canonical = canonicalize(target)
        if canonical is None or canonical in known:
            return 0
        target = canonical
        await self.budget.waive([target])
        element: JSON = {"url": target, "depth": depth, "redirects": redirects}
        result = await ctx.schedule_many(self.task, [element], only_if_new=True)
        self._known.add(ctx.backend, known, [target])
        return result.added

    async def _mark_fetched(self, ctx: Context, url: str, depth: int, response: Response) -> None:
        """Queues the URLs the redirects of `url` led to as fetched with it, so that a link to
        one of them found later is not fetched again (one already queued as a page of its own
        still is: "only if new" leaves it be). Every hop passed the scope check; none takes a
        page of the budget, as none sends a request of its own."""
        known = self._known.of(ctx.backend)
        hops = dict.fromkeys(hop.url for hop in response.chain[1:])
        reached = [hop for hop in hops if hop != url and hop not in known and is_canonical(hop)]
        if reached:
            marks: list[JSON] = [
                {"url": hop, "depth": depth, "fetched_with": url} for hop in reached
            ]
            await self.budget.waive(reached)  # a link to one, found by any process, is free
            await ctx.schedule_many(self.task, marks, only_if_new=True)
            self._known.add(ctx.backend, known, reached)

    async def _follow(self, ctx: Context, links: list[str], depth: int, exclude: set[str]) -> int:
        scope, known = self.settings.scope, self._known.of(ctx.backend)
        wanted = [
            link
            for link in links
            if link not in known and link not in exclude and scope.refusal(link) is None
        ]
        robots = ctx.fetcher.robots if ctx.fetcher.settings.robots else None
        # Links robots.txt (at hand) refuses are recorded, never fetched: no page of the budget.
        refused = {link for link in wanted if robots is not None and robots.disallows(link)}
        admitted = set(await self.budget.admit([link for link in wanted if link not in refused]))
        scheduled = [link for link in wanted if link in admitted or link in refused]
        if not scheduled:
            return 0
        elements: list[JSON] = [
            {"url": link, "depth": depth, "refused": True}
            if link in refused
            else {"url": link, "depth": depth}
            for link in scheduled
        ]
        result = await ctx.schedule_many(self.task, elements, only_if_new=True)
        self._known.add(ctx.backend, known, scheduled)
        return result.added


class KnownLinks:
    """Links this process has scheduled: the queue holds each (to do, done or dead), so
    scheduling it "only if new" again would change nothing. Skipping them saves the scope
    check, the budget and the backend's work for the links most pages repeat.

    Only while the backend is in the same epoch: a Redis back from a crash may have lost the
    last of them, and its queue has the page that found them to do again, whose links must
    then be scheduled anew."""

    def __init__(self, limit: int = MAX_KNOWN_LINKS) -> None:
        self.limit = limit
        self._links: set[str] = set()
        self._basis: tuple[Backend, int] | None = None

    def of(self, backend: Backend) -> set[str]:
        """The links known in the backend's present epoch (a new set when it changed)."""
        basis = (backend, backend.epoch)
        if basis != self._basis:
            self._links, self._basis = set(), basis
        return self._links

    def add(self, backend: Backend, known: set[str], links: list[str]) -> None:
        """Remembers `links`, scheduled while `known` was the known set; not if the epoch
        changed meanwhile: the schedule may be among what was lost."""
        if self.of(backend) is not known:
            return
        if len(known) + len(links) > self.limit:
            known.clear()
        known.update(links)


def _rendition(rendered: Rendered, html: str) -> Rendition:
    document = rendered.response
    return Rendition(url=document.url, final_url=rendered.url, html=html, fetched_at=time.time())


def _resource_scope(scope: Scope, browser: BrowserSettings) -> Callable[[str], None]:
    """Where a rendered page's requests may go: the scope's domains, with the browser's
    `resource_domains` (a CDN), and none of its exclude patterns. Its include patterns and
    depth say which pages to visit, not which scripts a page may load."""
    domains = (*scope.domains, *browser.resource_domains) if scope.domains else ()
    return Scope(domains=domains, exclude=scope.exclude).check


async def _store_all(store: ContentStore, responses: Iterable[Response]) -> RecordRef | None:
    ref = None
    for response in responses:
        ref = await store.put(response)
    return ref


def _ref_text(ref: RecordRef | None) -> str | None:
    return None if ref is None else f"{ref.file}:{ref.offset}"


def _error_record(
    base: _Base,
    error: FetchError,
    ref: RecordRef | None,
    started: float,
    *,
    retry: bool,
) -> PageRecord:
    last = error.responses[-1] if error.responses else None
    return PageRecord(
        url=base.url,
        depth=base.depth,
        attempt=base.attempt,
        status=last.status if last else None,
        final_url=last.url if last else None,
        fetched_at=last.fetched_at if last else None,
        fetch_time=round(time.monotonic() - started, 6),
        redirects=max(0, len(error.responses) - 1),
        error=error.reason.value,
        detail=error.detail,
        retry=retry,
        warc=_ref_text(ref),
    )
