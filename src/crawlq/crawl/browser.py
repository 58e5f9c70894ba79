"""Optional browser fetching: pages rendered by a headless Chromium, driven by Playwright,
with every request the page makes sent by crawlq's own fetcher.

One Chromium per worker process (the shared resource `crawlq.browser`), launched on first use
and closed with the worker; at most `BrowserSettings.pages` pages render at once, each in a
fresh browser context. The page's document is fetched first, as any page is (robots.txt,
redirects, its group's turn, WARC storage), and rendered only if it is HTML with a 2xx status:
Chromium is served that response, so the document is requested once.

Chromium never sends a request itself. Each request of the page (scripts, stylesheets, XHR
and fetch(), frames, further navigations) is intercepted (`page.route`) and fetched by crawlq,
with politeness, as `ctx.fetch` fetches: scope, the SSRF guard, robots.txt, the group's
interval, Retry-After pauses, backoff, proxies, cookies and the size cap apply to each, and
each counts against its own host's group, as a redirect's later hops do. A render sends one
request at a time to a host: to the page's own host within the slot its task holds, to any
other host one at a time for the whole worker. What is not http(s), WebSockets and event
streams, and images, media and fonts unless `media` allows them, are aborted. As a second
wall, Chromium runs with a proxy that leads nowhere, a resolver that resolves nothing and
WebRTC sending no UDP of its own: a request the interception missed fails rather than leaves.

The crawl's credentials (its sessions' cookies, logins, credential headers) go only with the
page's requests to its own site, as a browser sends SameSite=Strict cookies: a page's script
never gets another site's logged-in pages fetched for it. And crawlq, not Playwright, judges
CORS: a script reads another origin's answer only if that origin's server allows it (in the
answer's real Access-Control-Allow-* headers, after a real preflight where a browser sends
one); otherwise the request fails in the page as a browser fails it.

Failures are data: no Chromium -> FetchError(BROWSER_UNAVAILABLE); Chromium crashed or
broke off -> FetchError(BROWSER_FAILED), retried, with a new Chromium; a render slower than
`timeout` -> FetchError(TIMEOUT). A request crawlq refused or could not fetch is aborted (the
page goes on without it, as a browser does) and listed in `Rendered.resources`; but a 429/503
from the page's own host makes the render Throttled, as the page would be: incomplete, and
its host asked for a pause.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import os
import time
import weakref
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal
from urllib.parse import urlsplit

from ..errors import ConfigError, CrawlqError
from ..grouping import registered_domain, url_host
from ..observe.logs import logger
from .errors import FetchError, Reason, Throttled
from .redact import redact_url
from .response import Response

if TYPE_CHECKING:
    from playwright.async_api import Browser as Chromium
    from playwright.async_api import Page, Playwright, Route, WebSocketRoute

    from .fetcher import CredentialCheck, Fetcher
    from .politeness import Politeness

log = logger("crawlq.crawl")

DEFAULT_CHROMIUM = "/usr/bin/chromium"
#: The environment variable the command line reads the Chromium path from.
CHROMIUM_ENV = "CRAWLQ_CHROMIUM"
#: Playwright's resource types aborted unless `BrowserSettings.media` allows them.
MEDIA = frozenset({"image", "media", "font"})
#: Requests a whole response cannot answer: aborted.
STREAMS = frozenset({"websocket", "eventsource"})
#: Headers of Chromium's requests the fetcher sets itself (its user agent, its compression)
#: or that belong to one connection. Cookie goes on: aiohttp merges it with the session's
#: cookies (the session's win), so cookies the page's scripts set are sent too.
_OWN_HEADERS = frozenset(
    {
        "user-agent",
        "accept-encoding",
        "host",
        "connection",
        "keep-alive",
        "content-length",
        "transfer-encoding",
        "te",
        "trailer",
        "upgrade",
        "proxy-authorization",
        "proxy-connection",
    }
)
#: Headers of a response not passed to Chromium: the body it gets is decoded and whole.
_SPENT_HEADERS = frozenset(
    {"content-encoding", "content-length", "transfer-encoding", "connection", "keep-alive"}
)
#: ... nor, for the document crawlq took for a page, Content-Disposition: an attachment would
#: be a download to Chromium, never rendered ("Download is starting", a failed render).
_DOCUMENT_SPENT_HEADERS = _SPENT_HEADERS | {"content-disposition"}
#: Chromium's launch: a proxy that leads nowhere (port 9, discard, on a reserved address)
#: for every host, loopback included, a resolver that finds no name, and WebRTC kept to the
#: proxy (its STUN/TURN packets over UDP would go straight to any address a page names).
_NOWHERE = "http://0.0.0.0:9"
_LAUNCH_ARGS = (
    "--proxy-bypass-list=<-loopback>",
    "--host-resolver-rules=MAP * ~NOTFOUND",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-domain-reliability",
    "--no-pings",
    "--webrtc-ip-handling-policy=disable_non_proxied_udp",
)
#: Why crawlq refused a request, rather than failed to fetch it (Chromium sees the abort as
#: "blocked by client" rather than as a network failure).
_REFUSALS = frozenset(
    {Reason.OUT_OF_SCOPE, Reason.ROBOTS_DISALLOWED, Reason.BLOCKED, Reason.THROTTLED}
)

#: CORS (the Fetch standard): what a script may send another origin without a preflight.
_SIMPLE_METHODS = frozenset({"GET", "HEAD", "POST"})
_SIMPLE_HEADERS = frozenset({"accept", "accept-language", "content-language", "content-type"})
_SIMPLE_CONTENT_TYPES = frozenset(
    {"application/x-www-form-urlencoded", "multipart/form-data", "text/plain"}
)
_ACAO = "access-control-allow-origin"
#: Headers of a request that Chromium sets, not a script (the Fetch standard's forbidden
#: names, and those Chromium adds): none of them makes a request need a preflight.
_BROWSER_HEADERS = frozenset(
    {
        "accept-charset",
        "cookie",
        "cookie2",
        "date",
        "dnt",
        "expect",
        "origin",
        "priority",
        "referer",
        "upgrade-insecure-requests",
        "via",
    }
)
_BROWSER_HEADER_PREFIXES = ("sec-", "proxy-")
#: The requests whose script may ask that another origin get its credentials (fetch() and
#: XHR); a browser sends an element's request to another origin in CORS mode (a module
#: script, a font, `crossorigin` on an element) without them.
_CREDENTIALED_KINDS = frozenset({"fetch", "xhr"})
_DEFAULT_PORTS = {"http": 80, "https": 443}

#: Seconds a Chromium that failed a render has to open a context to be deemed alive.
PROBE_TIMEOUT = 10.0

WaitUntil = Literal["load", "domcontentloaded", "networkidle"]


@dataclass(frozen=True, kw_only=True, slots=True)
class BrowserSettings:
    """`executable`: the Chromium to run (Debian's by default; Playwright never downloads
    one). `pages`: pages a worker process renders at once. `timeout`: seconds a render may
    take, from its first request to the rendered DOM. `wait_until`: when a page is rendered:
    at its `load` event, or (`networkidle`, the default) once no request has been in flight
    for half a second after it, or `timeout` after the start, whichever comes first.
    `media`: let images, media and fonts be fetched too. `resource_domains`: hosts (with
    their sub-domains) a crawl's pages may load resources from although its scope does not
    allow them as pages, such as a CDN. `max_requests`: requests of one render beyond this
    many are aborted (the first one by crawlq; then the page's requests are no longer routed
    to crawlq at all, and fail in Chromium)."""

    executable: str = DEFAULT_CHROMIUM
    pages: int = 4
    timeout: float = 30.0
    wait_until: WaitUntil = "networkidle"
    media: bool = False
    resource_domains: tuple[str, ...] = ()
    max_requests: int = 500

    def __post_init__(self) -> None:
        if self.pages < 1:
            raise ConfigError(f"browser pages must be at least 1, got {self.pages}")
        if not self.timeout > 0:
            raise ConfigError(f"render timeout must be positive, got {self.timeout}")
        if self.wait_until not in ("load", "domcontentloaded", "networkidle"):
            raise ConfigError("wait_until must be load, domcontentloaded or networkidle")
        if self.max_requests < 1:
            raise ConfigError(f"max_requests must be at least 1, got {self.max_requests}")


@dataclass(frozen=True, kw_only=True, slots=True)
class Resource:
    """One request the page made: crawlq's answer's `status`, or the `error` (a Reason
    value; "skipped": not fetched by choice; "cors": another origin's answer that does not
    let the page's origin read it, failed as a browser's CORS check fails it) it was
    aborted with."""

    url: str
    kind: str  # Playwright's resource type: document, script, stylesheet, fetch, xhr...
    method: str = "GET"
    status: int | None = None
    error: str | None = None
    detail: str | None = None


@dataclass(frozen=True, kw_only=True, slots=True)
class Rendered:
    """A page as a browser shows it. `response` is its document as fetched (redirects in its
    history; what WARC stores). `html` is the DOM once rendered (`page.content()`), None if
    the document was not rendered (not HTML, or not 2xx). `url` is where the page ended up
    (a script may have navigated on). `resources`: every request the page made, in order."""

    response: Response
    html: str | None
    url: str
    resources: tuple[Resource, ...] = ()

    @property
    def refused(self) -> tuple[Resource, ...]:
        """The requests aborted rather than answered."""
        return tuple(r for r in self.resources if r.error is not None)


#: Fetches one request of a page for the browser: (url, method, headers, body, credentials)
#: -> answer, where `credentials` says which of its hops may go with the crawl's credentials
#: (cookies, logins, credential headers): `Fetcher.fetch`'s `credentials`, to pass on.
ResourceFetch = Callable[
    [str, str, Mapping[str, str], bytes | None, Callable[[str], bool]], Awaitable[Response]
]


def polite_fetch(
    politeness: Politeness,
    fetcher: Fetcher,
    *,
    scope: Callable[[str], Any] | None = None,
    robots: bool | None = None,
) -> ResourceFetch:
    """The requests of a page fetched as `Politeness.fetch` fetches a page, each counting
    against its own host's group (the group a redirect's later hop counts against).

    A page waits for its turn in the queue; a request of a page being rendered waits for its
    host's turn here: `Politeness.pace` would put back a request whose turn is more than
    MAX_PACING_WAIT away (a page goes back to the queue), and a host with a Crawl-delay of a
    few seconds would get none of its scripts. So it sleeps until its turn is near, counted
    from this worker's last request to the host, then is paced as any request (the render's
    timeout bounds the whole)."""
    from .politeness import MAX_PACING_WAIT

    async def fetch(
        url: str,
        method: str,
        headers: Mapping[str, str],
        data: bytes | None,
        credentials: CredentialCheck,
    ) -> Response:
        host = _host(url)
        last = fetcher.last_sent(host)
        if last is not None:
            turn = last + await politeness.interval(host) - MAX_PACING_WAIT / 2
            if turn > time.time():
                await asyncio.sleep(turn - time.time())
        return await politeness.fetch(
            fetcher,
            url,
            scope=scope,
            method=method,
            headers=headers,
            data=data,
            robots=robots,
            credentials=credentials,
        )

    return fetch


#: 2xx statuses that carry no page: Chromium stays where it was, and the render would fail.
_NO_CONTENT = frozenset({204, 205})


def renderable(response: Response) -> bool:
    return response.is_html and 200 <= response.status < 300 and response.status not in _NO_CONTENT


def require_playwright(what: str = "browser rendering") -> None:
    """ConfigError naming the extra to install if Playwright is missing."""
    try:
        import playwright.async_api  # noqa: F401
    except ImportError:
        raise ConfigError(
            f"{what} needs Playwright: pip install 'crawlq[browser]' (it drives the system's"
            f" Chromium, {DEFAULT_CHROMIUM} by default, and never downloads one)"
        ) from None


class Browser:
    """One headless Chromium for a worker: launched on first `render`, launched again after
    a crash, closed by `aclose` (the worker closes it as a shared resource). Use as an async
    context manager, or close with `aclose()`."""

    def __init__(self, settings: BrowserSettings | None = None) -> None:
        require_playwright()
        self.settings = settings or BrowserSettings()
        self._playwright: Playwright | None = None
        self._chromium: Chromium | None = None
        self._starting = asyncio.Lock()
        self._pages = asyncio.Semaphore(self.settings.pages)
        #: host -> the lock its requests from every render of this worker take in turn
        self._hosts: weakref.WeakValueDictionary[str, asyncio.Lock] = weakref.WeakValueDictionary()
        self.launches = 0

    async def __aenter__(self) -> Browser:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        async with self._starting:
            await self._shutdown()

    async def _shutdown(self) -> None:
        from playwright.async_api import Error

        chromium, self._chromium = self._chromium, None
        playwright, self._playwright = self._playwright, None
        if chromium is not None:
            # Already gone, or hung: Playwright's driver kills it as it stops.
            with contextlib.suppress(Error, TimeoutError):
                async with asyncio.timeout(PROBE_TIMEOUT):
                    await chromium.close()
        if playwright is not None:
            await playwright.stop()

    async def _launched(self, url: str) -> Chromium:
        """This worker's Chromium, launched if it is not running (or no longer)."""
        from playwright.async_api import Error, async_playwright

        async with self._starting:
            if self._chromium is not None and self._chromium.is_connected():
                return self._chromium
            await self._shutdown()
            path = self.settings.executable
            if not (os.path.isfile(path) and os.access(path, os.X_OK)):
                raise FetchError(
                    Reason.BROWSER_UNAVAILABLE,
                    url,
                    f"no Chromium at {path}: install one (scripts/install-chromium.sh) or"
                    f" give its path ({CHROMIUM_ENV}, --chromium, BrowserSettings.executable)",
                )
            try:
                self._playwright = await async_playwright().start()
                self._chromium = await self._playwright.chromium.launch(
                    executable_path=path,
                    headless=True,
                    proxy={"server": _NOWHERE},
                    args=list(_LAUNCH_ARGS),
                    timeout=self.settings.timeout * 1000,
                )
            except Error as exc:
                await self._shutdown()
                raise FetchError(
                    Reason.BROWSER_UNAVAILABLE, url, f"Chromium {path} did not start: {_line(exc)}"
                ) from exc
            self.launches += 1
            return self._chromium

    def host_lock(self, host: str) -> asyncio.Lock:
        lock = self._hosts.get(host)
        if lock is None:
            lock = self._hosts[host] = asyncio.Lock()
        return lock

    async def render(
        self,
        document: Response,
        fetch: ResourceFetch,
        *,
        wait_for: str | None = None,
        user_agent: str | None = None,
        max_bytes: int | None = None,
    ) -> Rendered:
        """Renders `document` (fetched already), fetching every request of the page with
        `fetch`; once `wait_until` says the page is ready, and `wait_for` (a CSS selector)
        matches if given. A document that is not HTML or not 2xx is returned unrendered. A
        rendered DOM over `max_bytes` (as UTF-8) is TOO_LARGE, as a body over it would be.

        Raises FetchError (the document among its responses) if the page could not be
        rendered, and Throttled if the page's own host answered one of its requests with
        429/503: the page is then incomplete, and its host asked for a pause."""
        if not renderable(document):
            return Rendered(response=document, html=None, url=document.url)
        from playwright.async_api import Error
        from playwright.async_api import TimeoutError as PlaywrightTimeout

        timeout = self.settings.timeout
        async with self._pages:
            deadline = time.monotonic() + timeout
            try:
                chromium = await self._launched(document.url)
            except FetchError as exc:
                raise FetchError(exc.reason, exc.url, exc.detail, responses=document.chain) from exc
            job = _Render(self, document, fetch)
            try:
                async with asyncio.timeout(timeout):
                    rendered = await self._render(
                        chromium, job, deadline, wait_for, user_agent, max_bytes
                    )
            except (TimeoutError, PlaywrightTimeout) as exc:
                if not await _alive(chromium):  # hung, not slow: it would never answer again
                    await self._forget(chromium)
                    raise FetchError(
                        Reason.BROWSER_FAILED,
                        document.url,
                        f"Chromium stopped answering: not rendered within {timeout:g}s",
                        responses=document.chain,
                    ) from exc
                why = str(exc) if isinstance(exc, TimeoutError) and str(exc) else ""
                raise FetchError(
                    Reason.TIMEOUT,
                    document.url,
                    f"not rendered within {timeout:g}s{f': {why}' if why else ''}",
                    responses=document.chain,
                ) from exc
            except Error as exc:
                if not await _alive(chromium):
                    await self._forget(chromium)
                raise FetchError(
                    Reason.BROWSER_FAILED, document.url, _line(exc), responses=document.chain
                ) from exc
        size = len(rendered.html.encode("utf-8", "replace")) if rendered.html else 0
        if max_bytes is not None and size > max_bytes:
            raise _too_large(document, max_bytes)
        paused = job.paused
        if paused is not None:
            raise Throttled(
                document.url,
                paused.until,
                f"{paused.url}, a request of the page: {paused.detail}",
                responses=document.chain,
                answered=True,
            )
        return rendered

    async def _forget(self, chromium: Chromium) -> None:
        """Drops a Chromium that crashed, broke off or hung: the next render launches another."""
        async with self._starting:
            if self._chromium is chromium:
                await self._shutdown()

    async def _render(
        self,
        chromium: Chromium,
        job: _Render,
        deadline: float,
        wait_for: str | None,
        user_agent: str | None,
        max_bytes: int | None,
    ) -> Rendered:
        from playwright.async_api import TimeoutError as PlaywrightTimeout

        def left() -> float:
            return max(1.0, (deadline - time.monotonic()) * 1000)

        context = await chromium.new_context(
            service_workers="block", accept_downloads=False, user_agent=user_agent
        )
        try:
            page = job.page = await context.new_page()
            await page.route("**/*", job.route)
            await page.route_web_socket("**/*", _refuse_web_socket)
            wait_until = self.settings.wait_until
            first: WaitUntil = "load" if wait_until == "networkidle" else wait_until
            await page.goto(job.document.url, wait_until=first, timeout=left())
            if wait_until == "networkidle":
                # A page that keeps polling is rendered as it is at the deadline.
                with contextlib.suppress(PlaywrightTimeout):
                    await page.wait_for_load_state("networkidle", timeout=left())
            if wait_for is not None:
                try:
                    await page.wait_for_selector(wait_for, state="attached", timeout=left())
                except PlaywrightTimeout as exc:
                    raise TimeoutError(f"nothing matched {wait_for!r}") from exc
            if max_bytes is not None and await _dom_length(page) > max_bytes:
                raise _too_large(job.document, max_bytes)  # not serialized, nor sent to us
            html = await page.content()
            return Rendered(
                response=job.document, html=html, url=page.url, resources=tuple(job.resources)
            )
        finally:
            await job.stop()
            await context.close()


def _too_large(document: Response, max_bytes: int) -> FetchError:
    return FetchError(
        Reason.TOO_LARGE,
        document.url,
        f"rendered DOM over {max_bytes} bytes",
        responses=document.chain,
    )


#: The length of what `page.content()` serializes, less the doctype: no more UTF-16 code
#: units than the UTF-8 bytes it would be.
_DOM_LENGTH = "document.documentElement ? document.documentElement.outerHTML.length : 0"


async def _dom_length(page: Page) -> int:
    """The rendered DOM's length (`_DOM_LENGTH`), measured in Chromium, so that a DOM over
    the size cap is never serialized and sent to crawlq (a few bytes of script can build
    hundreds of megabytes), in a world of its own, where the page's scripts cannot fake it."""
    cdp = await page.context.new_cdp_session(page)
    try:
        tree = await cdp.send("Page.getFrameTree")
        frame = tree["frameTree"]["frame"]["id"]
        world = await cdp.send("Page.createIsolatedWorld", {"frameId": frame})
        answer = await cdp.send(
            "Runtime.evaluate",
            {
                "expression": _DOM_LENGTH,
                "contextId": world["executionContextId"],
                "returnByValue": True,
            },
        )
    finally:
        await cdp.detach()
    return int(answer["result"]["value"])


async def _alive(chromium: Chromium) -> bool:
    """Whether Chromium still opens a context, after an error (its process may have died
    before Playwright noticed it was gone)."""
    from playwright.async_api import Error

    if not chromium.is_connected():
        return False
    try:
        async with asyncio.timeout(PROBE_TIMEOUT):
            context = await chromium.new_context()
            await context.close()
    except (Error, TimeoutError):
        return False
    return True


class _Render:
    """The requests of one render: each fetched by crawlq, in a task of its own that the end
    of the render cancels (a request never goes out for a page given up on)."""

    def __init__(self, browser: Browser, document: Response, fetch: ResourceFetch) -> None:
        self.browser = browser
        self.document = document
        self.fetch = fetch
        self.host = _host(document.url)
        self.site = _site(document.url)
        self.resources: list[Resource] = []
        self._served = False  # the document was handed to Chromium
        self._requests = 0  # the page's requests so far, answered or not yet
        self.page: Page | None = None  # set once open: its requests are routed here
        self._stopped = False
        #: A 429/503 the page's own host answered one of its requests with.
        self.paused: Throttled | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._own = asyncio.Lock()  # the page's own host: this render's turns

    async def route(self, route: Route) -> None:
        # A fresh context: nothing of whatever task Playwright dispatches from (a send slot
        # the fetcher keeps in a ContextVar) leaks into the request.
        task = asyncio.create_task(
            self._answer(route), name="crawlq-browser-request", context=contextvars.Context()
        )
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        await asyncio.wait([task])

    async def stop(self) -> None:
        self._stopped = True
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.wait(tasks)

    async def _answer(self, route: Route) -> None:
        """Answers one request of the page; nothing it meets ends the render but the render
        itself (a page closed meanwhile, a bug in a fetch: aborted, noted and logged)."""
        from playwright.async_api import Error

        request = route.request
        url, kind, method = request.url, request.resource_type, request.method
        try:
            await self._answer_with(route, url, kind, method)
        except Error:
            pass  # the page is gone: nothing to answer
        except Exception as exc:
            log.exception("answering %s for the browser failed", redact_url(url))
            self._note(url, kind, method, error="failed", detail=f"{type(exc).__name__}: {exc}")
            await _abort(route, "failed")

    async def _answer_with(self, route: Route, url: str, kind: str, method: str) -> None:
        request = route.request
        self._requests += 1
        try:
            if not self._served and request.is_navigation_request():
                self._served = True
                response = self.document
            else:
                self._check(url, kind)
                headers = await request.all_headers()
                # A navigation's answer becomes a document of its own origin: no script of
                # the page reads it, and a browser checks no CORS for it (a form's POST
                # carries an Origin all the same).
                origin = None if request.is_navigation_request() else headers.get("origin")
                data = request.post_data_buffer
                response = await self._fetched(url, kind, method, headers, data, origin)
        except _Skipped as exc:
            self._note(url, kind, method, error="skipped", detail=str(exc))
            if self._over():
                await self._unroute()  # before the page hears of it
            await _abort(route, "blockedbyclient")
        except _CorsRefused as exc:
            self._note(url, kind, method, error="cors", detail=str(exc))
            await _abort(route, "failed")
        except FetchError as exc:
            if isinstance(exc, Throttled) and exc.answered and _host(url) == self.host:
                self.paused = self.paused or exc
            self._note(url, kind, method, error=exc.reason.value, detail=exc.detail or None)
            await _abort(route, "blockedbyclient" if exc.reason in _REFUSALS else "failed")
        else:
            self._note(url, kind, method, status=response.status)
            spent = _DOCUMENT_SPENT_HEADERS if response is self.document else _SPENT_HEADERS
            await _fulfill(route, response, spent)

    def _note(
        self,
        url: str,
        kind: str,
        method: str,
        *,
        status: int | None = None,
        error: str | None = None,
        detail: str | None = None,
    ) -> None:
        self.resources.append(
            Resource(url=url, kind=kind, method=method, status=status, error=error, detail=detail)
        )

    def _check(self, url: str, kind: str) -> None:
        """_Skipped if the request is not to be fetched at all."""
        settings = self.browser.settings
        if self._stopped:
            raise _Skipped("the render is over")
        if urlsplit(url).scheme not in ("http", "https"):
            raise _Skipped("not http(s)")
        if kind in STREAMS:
            raise _Skipped(f"{kind}: a stream")
        if kind in MEDIA and not settings.media:
            raise _Skipped(f"{kind}: media are not fetched (BrowserSettings.media)")
        if self._over():
            raise _Skipped(f"over {settings.max_requests} requests")

    def _over(self) -> bool:
        return self._requests > self.browser.settings.max_requests  # counted as they come

    async def _unroute(self) -> None:
        """Past max_requests, the page's requests are no longer routed to crawlq: they fail
        in Chromium, at the proxy that leads nowhere. A page asking for thousands a second
        would otherwise keep the worker's loop answering them (and its memory holding them)
        far past the render's timeout."""
        from playwright.async_api import Error

        page, self.page = self.page, None
        if page is not None:
            with contextlib.suppress(Error):
                await page.unroute_all(behavior="ignoreErrors")

    async def _fetched(
        self,
        url: str,
        kind: str,
        method: str,
        headers: Mapping[str, str],
        data: bytes | None,
        origin: str | None,
    ) -> Response:
        """crawlq's answer to one request, fetched one at a time per host. crawlq follows
        the redirects itself (each hop checked as a page's are) and Chromium gets where they
        led: it would send the request a redirect answer leads to itself, past the
        interception (to the proxy that leads nowhere).

        Chromium takes whatever crawlq answers as its own, and Playwright, fulfilling a
        request from another origin, lets the page read it unless the answer says otherwise.
        So crawlq plays the browser's part: the crawl's credentials go only to the page's own
        site (`_credentials`), and a request a script makes to another origin (`origin`: the
        Origin header it carries, None for no CORS check) is answered only if that origin's
        server lets the page's origin read it, after a preflight crawlq sends itself where a
        browser would send one (Playwright answers Chromium's own preflights, allowing
        everything, before crawlq sees them). _CorsRefused otherwise."""
        host = _host(url)
        sent = {k: v for k, v in headers.items() if k.lower() not in _OWN_HEADERS}
        if origin is not None and origin.strip() == _origin(url):
            origin = None  # same-origin: nothing to check
        credentials = self._credentials(url)
        if origin is not None and kind not in _CREDENTIALED_KINDS:
            credentials = _never  # a module script, a font: a browser sends no credentials
        async with self._own if host == self.host else self.browser.host_lock(host):
            if origin is None:
                return await self.fetch(url, method, sent, data, credentials)
            credentials = await self._preflight(url, method, sent, origin, credentials)
            response = await self.fetch(url, method, sent, data, credentials)
            refusal = _chain_refusal(response, origin, credentials)
            if refusal is not None and _chain_refusal(response, origin, _never) is None:
                # Allowed only without credentials (`*`, no Allow-Credentials): what a
                # browser's fetch() or XHR reads by default, since crawlq cannot see whether
                # the script asked for them. The answer that went with them is not shown.
                response = await self.fetch(url, method, sent, data, _never)
                refusal = _chain_refusal(response, origin, _never)
        if refusal is not None:
            raise _CorsRefused(refusal)
        return response

    def _credentials(self, url: str) -> Callable[[str], bool]:
        """Which hops of a request to `url` go with the crawl's credentials (its cookies,
        logins and credential headers): those to the page's own site (scheme and registered
        domain), as a browser sends SameSite=Strict cookies, and only while they stay on
        `url`'s origin: Chromium takes the answer a redirect led to as `url`'s own, so
        another origin's would be read as if it were `url`'s."""
        site, origin = self.site, _origin(url)

        def credited(hop: str) -> bool:
            return _site(hop) == site and _origin(hop) == origin

        return credited

    async def _preflight(
        self,
        url: str,
        method: str,
        headers: Mapping[str, str],
        origin: str,
        credentials: Callable[[str], bool],
    ) -> Callable[[str], bool]:
        """The preflight a browser sends before a request to another origin that is not
        simple (another method than GET, HEAD or POST, or a header a script set beyond the
        simple ones), sent without credentials, as a browser sends it; _CorsRefused unless
        its answer allows the request. A request that goes with credentials needs its origin
        named (not `*`) and Access-Control-Allow-Credentials: without them, it goes without
        credentials, as a browser's fetch() by default. Returns `credentials`, or `_never`
        when the request is to go without."""
        unsafe = sorted(name.lower() for name, value in headers.items() if _unsafe(name, value))
        if method in _SIMPLE_METHODS and not unsafe:
            return credentials
        asked = {"origin": origin, "access-control-request-method": method, "accept": "*/*"}
        if unsafe:
            asked["access-control-request-headers"] = ",".join(unsafe)
        answer = await self.fetch(url, "OPTIONS", asked, None, _never)
        if credentials(url) and not _preflight_refusal(answer, origin, method, unsafe, True):
            return credentials
        refusal = _preflight_refusal(answer, origin, method, unsafe, False)
        if refusal is not None:
            raise _CorsRefused(refusal)
        return _never


class _Skipped(Exception):
    """A request of the page not fetched by choice."""


class _CorsRefused(Exception):
    """Another origin's answer the page's origin may not read, as a browser's CORS check
    would find (its preflight's, or its own)."""


def _never(_: str) -> bool:
    return False


def _chain_refusal(
    response: Response, origin: str, credentials: Callable[[str], bool]
) -> str | None:
    """Why `response` does not let `origin` read it, checking each answer of its redirect
    chain as a browser checks each (None if it does); an answer that went with the crawl's
    credentials (`credentials`) must allow them."""
    credited = True
    for answer in response.chain:
        credited = credited and credentials(answer.url)
        refusal = _cors_refusal(answer, origin, credentialed=credited)
        if refusal is not None:
            return refusal
    return None


def _cors_refusal(answer: Response, origin: str, *, credentialed: bool) -> str | None:
    """Why `answer` does not let `origin` read it (None if it does): it must name `origin`
    in one Access-Control-Allow-Origin, or say `*`; and, if the request went with the
    crawl's credentials (whatever credentials mode the script asked for: crawlq cannot see
    it), name it and allow credentials."""
    values = [value.strip() for name, value in answer.headers if name.lower() == _ACAO]
    where = redact_url(answer.url)
    if not values:
        return f"{where} has no Access-Control-Allow-Origin"
    if len(values) > 1 or values[0] not in (origin, "*"):
        return f"{where} does not allow the origin {origin}"
    if credentialed and (
        values[0] == "*"
        or (answer.header("Access-Control-Allow-Credentials") or "").strip() != "true"
    ):
        return f"{where} does not allow credentials from {origin}"
    return None


def _preflight_refusal(
    answer: Response, origin: str, method: str, unsafe: list[str], credentialed: bool
) -> str | None:
    """Why the answer to a preflight does not allow a request (`method`, with the headers
    named `unsafe`) from `origin`; None if it does. `*` allows any method or header only to
    a request without credentials, as for the origin."""
    if answer.history:
        return "the preflight was redirected"
    if not 200 <= answer.status < 300:
        return f"the preflight was answered {answer.status}"
    refusal = _cors_refusal(answer, origin, credentialed=credentialed)
    if refusal is not None:
        return refusal
    methods = _tokens(answer, "Access-Control-Allow-Methods")
    any_method = not credentialed and "*" in methods
    if method not in _SIMPLE_METHODS and method not in methods and not any_method:
        return f"the preflight does not allow {method}"
    allowed = {name.lower() for name in _tokens(answer, "Access-Control-Allow-Headers")}
    any_header = not credentialed and "*" in allowed
    missing = [name for name in unsafe if name not in allowed]
    if missing and not any_header:
        return f"the preflight does not allow the header {missing[0]}"
    return None


def _tokens(answer: Response, name: str) -> set[str]:
    """The comma-separated values of `answer`'s headers called `name`."""
    lower = name.lower()
    values = (value for key, value in answer.headers if key.lower() == lower)
    return {token.strip() for value in values for token in value.split(",") if token.strip()}


def _unsafe(name: str, value: str) -> bool:
    """Whether a request header makes a request to another origin need a preflight: one a
    script set (not Chromium), other than the simple ones with a simple value."""
    lower = name.lower()
    if lower in _BROWSER_HEADERS or lower.startswith(_BROWSER_HEADER_PREFIXES):
        return False
    if lower == "content-type":
        return value.split(";", 1)[0].strip().lower() not in _SIMPLE_CONTENT_TYPES
    return lower not in _SIMPLE_HEADERS


def _origin(url: str) -> str:
    """scheme://host[:port] of `url`, as a browser writes it in an Origin header."""
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    host = _host(url)
    if ":" in host:
        host = f"[{host}]"
    try:
        port = parts.port
    except ValueError:
        port = None
    shown = port is not None and port != _DEFAULT_PORTS.get(scheme)
    return f"{scheme}://{host}:{port}" if shown else f"{scheme}://{host}"


def _site(url: str) -> str:
    """scheme://registered-domain of `url`: what a browser takes as its site."""
    return f"{urlsplit(url).scheme.lower()}://{registered_domain(_host(url))}"


async def _fulfill(route: Route, response: Response, spent: frozenset[str]) -> None:
    """Answers the request with `response`, without its headers named in `spent`."""
    from playwright.async_api import Error

    headers: dict[str, str] = {}
    for name, value in response.headers:
        lower = name.lower()
        if lower in spent:
            continue
        if lower in headers:  # Playwright takes repeated headers as lines of one value
            headers[lower] += ("\n" if lower == "set-cookie" else ", ") + value
        else:
            headers[lower] = value
    with contextlib.suppress(Error):  # the page was closed meanwhile
        await route.fulfill(status=response.status, headers=headers, body=response.body)


async def _abort(route: Route, code: str) -> None:
    from playwright.async_api import Error

    with contextlib.suppress(Error):
        await route.abort(code)


def _refuse_web_socket(socket: WebSocketRoute) -> Awaitable[None]:
    """A WebSocket is never connected (crawlq's fetcher speaks HTTP only): closed at once."""
    return socket.close(code=1008, reason="crawlq fetches no WebSockets")


def _host(url: str) -> str:
    try:
        return url_host(url)
    except CrawlqError:
        return (urlsplit(url).hostname or "").lower()


def _line(exc: BaseException, limit: int = 300) -> str:
    """Playwright's messages span lines (a call log follows): the first line, capped."""
    text = str(exc).strip() or type(exc).__name__
    line = text.splitlines()[0]
    return line if len(line) <= limit else line[: limit - 3] + "..."


__all__ = [
    "DEFAULT_CHROMIUM",
    "Browser",
    "BrowserSettings",
    "Rendered",
    "Resource",
    "ResourceFetch",
    "polite_fetch",
    "renderable",
    "require_playwright",
]
