"""The web dashboard: an ASGI app (Starlette) over one backend.

Pages: queues (counts and a chart of the last minutes), groups (who is throttled and why),
workers, dead letters (re-queue and purge, each confirmed) and one element. Each page's live
part reloads itself from ``?fragment=1`` every couple of seconds, without reloading the page.
`/metrics` serves the Prometheus text format; `/api/stats` the numbers of `crawlq stats
--json` (stats_json writes both). The guard (security.py) checks the token and CSRF.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import glob
import hashlib
import hmac
import html
import json
import math
import time
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable, Iterable, Mapping
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

from jinja2 import Environment, FileSystemLoader, select_autoescape
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.middleware.trustedhost import TrustedHostMiddleware
from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from ..backends import Backend
from ..checks import MAX_SECONDS
from ..errors import CrawlqError, UnknownQueue
from ..grouping import bounded_glob, group_pattern
from ..types import GroupStats, QueueStats, WorkerInfo
from .logs import redact
from .metrics import METRIC_GROUPS, exposition, throttle_reason
from .observer import Observer, rates
from .security import Guard, GuardMiddleware, HeadersMiddleware, read_form

HERE = Path(__file__).parent
DEAD_PAGE = 50
#: The largest dead-letter offset asked of a backend: an offset plus a page stays a 64-bit
#: integer (SQLite and Redis refuse larger ones).
MAX_OFFSET = 2**62
#: Elements listed under each worker on the workers page.
WORKER_ELEMENTS = 10
LOOPBACK_HOSTS = ["127.0.0.1", "localhost", "::1", "[::1]"]
REFRESH_MS = 1500
#: Pages without a part that updates itself.
STATIC_PAGES = ("confirm.html", "element.html")
#: Keys holding credentials that pages named by reference, the most recent kept.
SEALED_KEYS = 10_000


def _done_message(query: Mapping[str, str], queue: str) -> str:
    """What an action did, said on the page it leads back to: built from its kind and count,
    never text the link carries (a link could make the page say anything)."""
    done = {"requeue": "re-queued", "purge": "purged"}.get(query.get("done", ""))
    count = query.get("count", "")
    if done is None or not queue or not count.isdigit() or len(count) > 12:
        return ""
    return f"{done} {count} dead element{'s' if count != '1' else ''} of {queue}"


def _age(seconds: float) -> str:
    seconds = max(0.0, seconds)
    if seconds >= MAX_SECONDS:  # a block for good is until infinity
        return "100y+"
    if seconds < 90:
        return f"{seconds:.0f}s"
    if seconds < 5400:
        return f"{seconds / 60:.0f}m"
    return f"{seconds / 3600:.1f}h"


def _clock(moment: float) -> str:
    try:
        return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(moment))
    except (OverflowError, OSError, ValueError):  # infinity (a block for good), or years away
        return "far future" if moment > 0 else "far past"


def _until(moment: float | None, now: float) -> str:
    if moment is None or moment <= now:
        return "now"
    return f"in {_age(moment - now)}"


def _limit(group: GroupStats) -> str:
    at_once = "unlimited" if group.limit.concurrency is None else str(group.limit.concurrency)
    return f"{at_once} at once, {group.limit.interval:g}s apart"


def _why(group: GroupStats, now: float) -> str:
    reason = throttle_reason(group, now)
    if reason == "blocked":
        return f"blocked: {redact(group.block_reason or 'no reason given')}"
    if reason == "full":
        return "full: every slot in flight"
    if reason == "interval":
        return "interval: waiting between starts"
    return "-"


def sparkline(values: list[float], width: int = 160, height: int = 32) -> str:
    """SVG polyline points for `values`, scaled to the box."""
    if not values:
        return ""
    top = max(values) or 1.0
    step = width / max(1, len(values) - 1)
    return " ".join(
        f"{i * step:.1f},{height - 2 - (v / top) * (height - 4):.1f}" for i, v in enumerate(values)
    )


#: Why a search is refused (see glob_for).
SEARCH_REFUSED = (
    "a search may hold one * before its end, not more (as in *.gov, *shop*, shop.*):"
    " more would hold up the backend"
)


def glob_for(search: str) -> str | None:
    """A search box's text as a glob: itself if it has glob characters, else *text*; spelled
    as group names are (lower case, IDNA: `Bücher.DE` finds xn--bcher-kva.de). None for a
    glob with more than one * before its end: Redis matches globs by backtracking, so a
    search like *?*?*?*?*?*?*?*?# would take minutes over each group name, and every worker
    waits for Redis meanwhile (runs of * are one *; a trailing one costs nothing)."""
    search = group_pattern(search.strip())
    if not search:
        return "*"
    if not any(c in search for c in "*?["):
        return f"*{search}*"
    return bounded_glob(search)


class Dashboard:
    """Request handlers over one Observer; `app()` builds the ASGI app."""

    def __init__(
        self,
        backend: Backend,
        *,
        token: str | None = None,
        ttl: float = 1.0,
        metric_groups: int = METRIC_GROUPS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.backend = backend
        self.metric_groups = metric_groups
        self.observer = Observer(backend, ttl=ttl)
        self.guard = Guard(token, clock=clock)  # the clock times the login limit
        self.templates = Environment(
            loader=FileSystemLoader(HERE / "templates"),
            autoescape=select_autoescape(default=True, default_for_string=True),
        )
        self.templates.globals.update(
            age=_age,
            clock=_clock,
            until=_until,
            limit=_limit,
            why=_why,
            refresh=REFRESH_MS,
            key_field=self.key_field,
        )
        self.templates.filters["redact"] = redact
        self._sealed: OrderedDict[str, str] = OrderedDict()

    # -- keys that hold credentials ------------------------------------------------------------

    def key_field(self, key: str) -> tuple[str, str]:
        """How a page names an element in a link or a form: ("key", the key), or, for a key
        holding credentials (a URL with a password), ("ref", a reference to it) so that the
        page never carries the secret. The dashboard keeps the SEALED_KEYS latest references."""
        if redact(key) == key:
            return "key", key
        ref = hmac.new(self.guard.secret, key.encode(), hashlib.sha256).hexdigest()[:32]
        self._sealed[ref] = key
        self._sealed.move_to_end(ref)
        while len(self._sealed) > SEALED_KEYS:
            self._sealed.popitem(last=False)
        return "ref", ref

    def key_of(self, fields: Mapping[str, str]) -> str | None:
        """The key a link or form names (see key_field); None for a reference too old."""
        if fields.get("ref"):
            return self._sealed.get(fields["ref"])
        return fields.get("key", "")

    def app(self, *, allowed_hosts: list[str] | None = None) -> Starlette:
        middleware = [Middleware(GuardMiddleware, guard=self.guard)]
        if allowed_hosts:
            middleware.insert(0, Middleware(TrustedHostMiddleware, allowed_hosts=allowed_hosts))
        middleware.insert(0, Middleware(HeadersMiddleware))
        routes = [
            Route("/", self.queues_page),
            Route("/groups", self.groups_page),
            Route("/workers", self.workers_page),
            Route("/dead", self.dead_page),
            Route("/dead/requeue", self.dead_action, methods=["POST"]),
            Route("/dead/purge", self.dead_action, methods=["POST"]),
            Route("/element", self.element_page),
            Route("/metrics", self.metrics),
            Route("/api/stats", self.api_stats),
            Mount("/static", StaticFiles(directory=HERE / "static"), name="static"),
        ]
        return Starlette(routes=routes, middleware=middleware, lifespan=self._lifespan)

    @contextlib.asynccontextmanager
    async def _lifespan(self, _app: Starlette) -> AsyncIterator[None]:
        await self.observer.start()
        try:
            yield
        finally:
            await self.observer.stop()

    # -- rendering -----------------------------------------------------------------------------

    def _render(self, request: Request, name: str, **context: Any) -> HTMLResponse:
        fragment = request.query_params.get("fragment") == "1"
        session = request.scope.get("state", {}).get("session", "")
        live = request.url.path + "?" + urlencode({**request.query_params, "fragment": "1"})
        page = self.templates.get_template(name).render(
            request=request,
            fragment=fragment,
            live_url=live,
            live=name not in STATIC_PAGES,
            csrf=self.guard.csrf_for(session),
            logout=self.guard.token is not None,
            backend_url=redact(self.backend.url),
            **context,
        )
        return HTMLResponse(page, headers={"cache-control": "no-store"})

    # -- pages ---------------------------------------------------------------------------------

    async def queues_page(self, request: Request) -> Response:
        queues = await self.observer.queues()
        workers = await self.observer.workers()
        now = self.backend.now()
        rows = []
        for q in queues:
            series = self.observer.series(q.name)
            rows.append(
                {
                    "stats": q,
                    "total_line": sparkline([float(s.total) for _, s in series]),
                    "running_line": sparkline([float(s.running) for _, s in series]),
                    "span": _age(series[-1][0] - series[0][0]) if len(series) > 1 else "",
                    "rates": rates(series),
                }
            )
        return self._render(
            request, "queues.html", rows=rows, workers=workers, now=now, page="queues"
        )

    async def groups_page(self, request: Request) -> Response:
        search = request.query_params.get("q", "")
        pattern = glob_for(search)
        groups = await self.observer.groups(pattern) if pattern is not None else []
        now = self.backend.now()
        throttled = sum(1 for g in groups if throttle_reason(g, now) is not None)
        page = self._render(
            request,
            "groups.html",
            groups=groups,
            search=search,
            refused=SEARCH_REFUSED if pattern is None else "",
            now=now,
            throttled=throttled,
            page="groups",
        )
        page.status_code = 400 if pattern is None else 200
        return page

    async def workers_page(self, request: Request) -> Response:
        workers = await self.observer.workers()
        held = {
            w.id: await self.backend.worker_elements(w.id, limit=WORKER_ELEMENTS) for w in workers
        }
        return self._render(
            request,
            "workers.html",
            workers=workers,
            held=held,
            shown=WORKER_ELEMENTS,
            now=self.backend.now(),
            page="workers",
        )

    async def dead_page(self, request: Request) -> Response:
        queues = await self.observer.queues()
        queue = request.query_params.get("queue") or next(
            (q.name for q in queues if q.dead), queues[0].name if queues else ""
        )
        offset = min(MAX_OFFSET, max(0, _int(request.query_params.get("offset"), 0)))
        letters = []
        if queue:
            try:
                letters = await self.observer.dead_letters(queue, limit=DEAD_PAGE, offset=offset)
            except UnknownQueue:
                queue = ""
        return self._render(
            request,
            "dead.html",
            queues=queues,
            queue=queue,
            letters=letters,
            offset=offset,
            page_size=DEAD_PAGE,
            message=_done_message(request.query_params, queue),
            page="dead",
        )

    async def dead_action(self, request: Request) -> Response:
        # Read as it comes, refused past MAX_FORM_BYTES: never a whole huge body in memory.
        form = await read_form(request.receive)
        if form is None:
            return Response("form too large", status_code=413)
        if not self.guard.csrf_ok(request.scope, form):
            return Response(
                "refused: missing or wrong CSRF token (reload the page and try again)",
                status_code=403,
            )
        action = "requeue" if request.url.path.endswith("requeue") else "purge"
        queue = form.get("queue", "")
        everything = form.get("all") == "1"
        key = self.key_of(form)
        if key is None:
            return Response("this page is too old: reload it and try again", status_code=400)
        if not queue or not (everything or key):
            return Response("name a queue, and a key or all=1", status_code=400)
        if form.get("confirm") != "yes":
            return self._render(
                request,
                "confirm.html",
                action=action,
                queue=queue,
                key=key,
                everything=everything,
                page="dead",
            )
        keys = None if everything else [key]
        try:
            if action == "requeue":
                count = await self.backend.requeue_dead(queue, keys)
            else:
                count = await self.backend.purge_dead(queue, keys)
        except CrawlqError as exc:
            return Response(html.escape(redact(str(exc))), status_code=400)
        query = urlencode({"queue": queue, "done": action, "count": count})
        return RedirectResponse(f"/dead?{query}", status_code=303)

    async def element_page(self, request: Request) -> Response:
        queues = await self.observer.queues()
        queue = request.query_params.get("queue", "")
        key = self.key_of(request.query_params)
        found = None
        error = ""
        if key is None:
            key, error = "", "this link is too old: look the element up again"
        if queue and key:
            try:
                found = await self.backend.element(queue, key)
            except UnknownQueue as exc:
                error = str(exc)
        group = None
        if found is not None and found.group:
            named = glob.escape(found.group)  # a group's own name, not a pattern
            stats = await self.backend.group_stats(named, limit=1, include_idle=True)
            group = stats[0] if stats else None
        return self._render(
            request,
            "element.html",
            queues=queues,
            queue=queue,
            key=key,
            element=found,
            letter=found.dead if found else None,
            group=group,
            error=error,
            now=self.backend.now(),
            page="element",
        )

    # -- machine-readable ----------------------------------------------------------------------

    async def metrics(self, request: Request) -> Response:
        snapshot = await self.observer.snapshot()
        # Merging every worker process's files takes a while with many of them: in a thread,
        # so that the other pages are served meanwhile.
        text = await asyncio.to_thread(exposition, snapshot, self.metric_groups)
        return Response(
            text,
            media_type="text/plain; version=0.0.4; charset=utf-8",
            headers={"cache-control": "no-store"},
        )

    async def api_stats(self, request: Request) -> Response:
        snapshot = await self.observer.snapshot()
        text = stats_json(snapshot.queues, snapshot.groups, snapshot.workers, snapshot.at)
        return Response(text, media_type="application/json", headers={"cache-control": "no-store"})


def stats_json(
    queues: Iterable[QueueStats],
    groups: Iterable[GroupStats],
    workers: Iterable[WorkerInfo],
    now: float,
    *,
    indent: int | None = None,
) -> str:
    """The numbers of `/api/stats` and `crawlq stats --json`, one document for both, in
    standard JSON (allow_nan=False: JSON.parse and jq read no Infinity, so a number beyond
    it is an error here, never a document they refuse). A group has `blocked_until`, the
    backend's time (as `now`) its block ends, null when not blocked or blocked for good,
    and `blocked_for_good`, true for a block with no end (until infinity in the backend)."""
    document = {
        "queues": [dataclasses.asdict(q) for q in queues],
        "groups": [_group_json(g) for g in groups],
        "workers": [
            {k: v for k, v in dataclasses.asdict(w).items() if k != "wake_address"} for w in workers
        ],
        "now": now,
    }
    return json.dumps(document, indent=indent, sort_keys=True, allow_nan=False)


def _group_json(group: GroupStats) -> dict[str, Any]:
    found = dataclasses.asdict(group)
    for_good = group.blocked_until == math.inf
    found["blocked_until"] = None if for_good else group.blocked_until
    found["blocked_for_good"] = for_good
    found["block_reason"] = group.block_reason and redact(group.block_reason)
    return found


def _int(text: str | None, default: int) -> int:
    try:
        return int(text) if text is not None else default
    except ValueError:
        return default
