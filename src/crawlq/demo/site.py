"""The demo's partner sites: several sub-domains, each on its own loopback address
(127.0.3.1, 127.0.3.2, ...), reached through a static resolve map and a forward proxy whose
connections leave from one fixed egress address (the sites refuse any other).

Each sub-domain wants a username/password login (POST /login sets a session cookie; without
it, 401), lists its reports as JSON pages (/reports?page=N) and serves them as HTML, CSV or
JSON, each in its own shape. A little latency, and a few reports fail their first request
with a 503 or a 500. Every request is logged (host, path, arrival, end, status, peer), and
the number in flight per host is tracked, so the demo and the tests check politeness and the
proxy from the server's side. The sites also know the true totals of what they serve.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import random
import secrets
import socket
import threading
import time
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from ..crawl.testing.proxy import ForwardProxy
from ..crawl.testing.sites import peak_in_flight as peak_in_flight  # for the demo and its tests

HOSTS = (
    "eu.acme.demo",
    "us.acme.demo",
    "reports.globex.demo",
    "archive.globex.demo",
    "data.initech.demo",
    "files.initech.demo",
    "portal.umbrella.demo",
    "exports.umbrella.demo",
)
FORMATS = ("html", "csv", "json")
PRODUCTS = tuple(f"P{n:03d}" for n in (7, 12, 31, 42, 55, 68, 73, 90))
REGIONS = ("eu-west", "eu-north", "us-east", "us-west", "apac")
PAGE_SIZE = 250
ADDRESS_PREFIX = "127.0.3."
NETWORK = "127.0.3.0/24"  # what the fetcher must be allowed to reach
EGRESS_ADDRESS = "127.0.3.254"
USERNAME = "demo"


def _fraction(text: str) -> float:
    digest = hashlib.blake2b(text.encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2**64


@dataclass(frozen=True, kw_only=True, slots=True)
class Line:
    product: str  # canonical: P042
    region: str  # canonical: eu-west
    units: int
    cents: int


@dataclass(frozen=True, kw_only=True, slots=True)
class Report:
    number: int
    host: str
    format: str
    date: str
    lines: tuple[Line, ...]

    @property
    def path(self) -> str:
        return f"/reports/{self.number:06d}.{self.format}"


def make_report(number: int) -> Report:
    rng = random.Random(number)
    lines = tuple(
        Line(
            product=rng.choice(PRODUCTS),
            region=rng.choice(REGIONS),
            units=rng.randint(1, 400),
            cents=rng.randint(100, 250_000),
        )
        for _ in range(rng.randint(3, 8))
    )
    return Report(
        number=number,
        host=HOSTS[number % len(HOSTS)],
        format=FORMATS[(number // len(HOSTS)) % len(FORMATS)],
        date=f"2026-11-{1 + number % 28:02d}",
        lines=lines,
    )


def render(report: Report) -> tuple[str, str]:
    """The report's body and content type, in its partner's own shape."""
    if report.format == "csv":  # European: semicolons, decimal commas, labels as written
        rows = ["Product;Region;Units;Revenue EUR"]
        for line in report.lines:
            region = line.region.title()
            euros = f"{line.cents // 100},{line.cents % 100:02d}"
            rows.append(f"{line.product[0]}-{line.product[1:]};{region};{line.units};{euros}")
        body = f"# report {report.number} of {report.date}\n" + "\n".join(rows) + "\n"
        return body, "text/csv; charset=utf-8"
    if report.format == "json":
        document = {
            "report": report.number,
            "date": report.date,
            "lines": [
                {
                    "sku": line.product.lower(),
                    "area": line.region.replace("-", "_"),
                    "qty": line.units,
                    "amount_cents": line.cents,
                }
                for line in report.lines
            ],
        }
        return json.dumps(document), "application/json"
    cells = "".join(
        f"<tr><td>{line.product[0]} {line.product[1:]}</td><td>{line.region.upper()}</td>"
        f"<td>{line.units}</td><td>&euro;{line.cents / 100:,.2f}</td></tr>"
        for line in report.lines
    )
    body = (
        f"<!doctype html><html><head><title>Report {report.number}</title></head><body>"
        f'<h1>Sales report {report.number}</h1><p class="date">{report.date}</p>'
        '<table class="sales"><tr><th>Product</th><th>Region</th><th>Units</th>'
        f"<th>Revenue</th></tr>{cells}</table></body></html>"
    )
    return body, "text/html; charset=utf-8"


@dataclass(kw_only=True)
class Hit:
    host: str
    method: str
    path: str
    at: float
    peer: str
    ended: float | None = None
    status: int | None = None


@dataclass(kw_only=True)
class Totals:
    units: int = 0
    cents: int = 0


@dataclass(kw_only=True)
class DemoSite:
    """The partner sites' state: what they serve, who logged in, every request."""

    reports: int
    latency: float = 0.02
    errors: float = 0.02
    password: str = field(default_factory=lambda: secrets.token_urlsafe(12), repr=False)
    egress: str | None = EGRESS_ADDRESS
    hits: list[Hit] = field(default_factory=list)
    active: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    peak: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    # Tests set crowd: a host's report requests then wait (at most crowd_wait seconds)
    # until that many of its requests are in flight at once, so a run on a loaded
    # machine still shows whether the per-host limit lets that many through.
    crowd: int = 0
    crowd_wait: float = 20.0  # under the demo fetcher's read timeout
    crowd_timeouts: int = 0  # reports that stopped waiting for the crowd
    logins: int = 0
    _crowded: dict[str, asyncio.Event] = field(default_factory=dict)
    _sessions: set[str] = field(default_factory=set)
    _served: set[str] = field(default_factory=set)

    def numbers(self, host: str) -> list[int]:
        index = HOSTS.index(host)
        return list(range(index, self.reports, len(HOSTS)))

    def truth(self) -> dict[str, Totals]:
        """Units and revenue per product over every report served."""
        totals: dict[str, Totals] = defaultdict(Totals)
        for number in range(self.reports):
            for line in make_report(number).lines:
                totals[line.product].units += line.units
                totals[line.product].cents += line.cents
        return dict(totals)

    def reset_failures(self) -> None:
        """Every report fails its next first request again (a new night)."""
        self._served.clear()

    def report_hits(self) -> list[Hit]:
        return [h for h in self.hits if h.path.startswith("/reports/")]

    def application(self) -> web.Application:
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self._handle)
        return app

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        host = (request.url.host or "").lower()
        hit = Hit(
            host=host,
            method=request.method,
            path=request.path_qs,
            at=time.time(),
            peer=str(request.remote),
        )
        self.hits.append(hit)
        self.active[host] += 1
        self.peak[host] = max(self.peak[host], self.active[host])
        if self.crowd and self.peak[host] >= self.crowd:
            self._crowd(host).set()
        try:
            answer = await self._answer(request, host)
            hit.status = answer.status
            return answer
        finally:
            self.active[host] -= 1
            hit.ended = time.time()

    async def _answer(self, request: web.Request, host: str) -> web.StreamResponse:
        if host not in HOSTS:
            return web.Response(status=421, text=f"no site {host}")
        if self.egress is not None and request.remote != self.egress:
            return web.Response(status=403, text="only the partner's egress address may connect")
        if self.latency:
            await asyncio.sleep(self.latency)
        if request.path == "/robots.txt":
            return web.Response(text="User-agent: *\nAllow: /\n", content_type="text/plain")
        if request.path == "/login":
            return await self._login(request)
        if request.cookies.get("session") not in self._sessions:
            return web.Response(
                status=401, text="log in first", headers={"WWW-Authenticate": "Form"}
            )
        if request.path == "/reports":
            return self._listing(request, host)
        if self.crowd:
            try:
                await asyncio.wait_for(self._crowd(host).wait(), self.crowd_wait)
            except TimeoutError:
                self.crowd_timeouts += 1
        return self._report(request, host)

    def _crowd(self, host: str) -> asyncio.Event:
        return self._crowded.setdefault(host, asyncio.Event())

    async def _login(self, request: web.Request) -> web.StreamResponse:
        if request.method != "POST":
            return web.Response(
                text='<form method="post"><input name="username">'
                '<input name="password" type="password"></form>',
                content_type="text/html",
            )
        form = await request.post()
        if form.get("username") != USERNAME or form.get("password") != self.password:
            return web.Response(status=403, text="wrong username or password")
        token = secrets.token_hex(16)
        self._sessions.add(token)
        self.logins += 1
        answer = web.Response(text="welcome")
        answer.set_cookie("session", token, httponly=True)
        return answer

    def _listing(self, request: web.Request, host: str) -> web.StreamResponse:
        try:
            page = int(request.query.get("page", "0"))
        except ValueError:
            return web.Response(status=400, text="bad page")
        numbers = self.numbers(host)
        chunk = numbers[page * PAGE_SIZE : (page + 1) * PAGE_SIZE]
        more = (page + 1) * PAGE_SIZE < len(numbers)
        document: dict[str, Any] = {
            "reports": [make_report(n).path for n in chunk],
            "next": f"/reports?page={page + 1}" if more else None,
        }
        return web.json_response(document)

    def _report(self, request: web.Request, host: str) -> web.StreamResponse:
        name = request.path.removeprefix("/reports/")
        stem, _, extension = name.partition(".")
        if not stem.isdigit() or int(stem) >= self.reports:
            return web.Response(status=404, text="no such report")
        report = make_report(int(stem))
        if report.host != host or report.format != extension:
            return web.Response(status=404, text="no such report")
        key = f"{host}{request.path}"
        if key not in self._served:
            self._served.add(key)
            if _fraction(key) < self.errors:  # a transient failure, once
                status = 500 if _fraction(key + "#") < 0.3 else 503
                return web.Response(status=status, text="temporarily unavailable")
        body, content_type = render(report)
        return web.Response(body=body.encode(), headers={"Content-Type": content_type})


class DemoServers:
    """The sites and the proxy, served on a thread of their own (their own event loop), so
    the ETL's loop and theirs do not slow each other down. `with DemoServers(site) as s:`;
    then `s.base(host)`, `s.resolve`, `s.proxy_url`, `s.proxy_requests`."""

    def __init__(self, site: DemoSite) -> None:
        self.site = site
        self.resolve = {host: f"{ADDRESS_PREFIX}{i + 1}" for i, host in enumerate(HOSTS)}
        self.ports: dict[str, int] = {}
        self.proxy: ForwardProxy | None = None
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="crawlq-demo-sites")
        self._runner: web.AppRunner | None = None
        self._sockets: list[socket.socket] = []

    def base(self, host: str) -> str:
        return f"http://{host}:{self.ports[host]}"

    @property
    def proxy_url(self) -> str:
        assert self.proxy is not None
        return self.proxy.url

    @property
    def proxy_requests(self) -> list[str]:
        return list(self.proxy.requests) if self.proxy is not None else []

    def url_of(self, hit: Hit) -> str:
        return f"{self.base(hit.host)}{hit.path}"

    def __enter__(self) -> DemoServers:
        self._thread.start()
        try:
            asyncio.run_coroutine_threadsafe(self._start(), self._loop).result(timeout=30)
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        if self._thread.is_alive():
            asyncio.run_coroutine_threadsafe(self._stop(), self._loop).result(timeout=30)
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=30)
        self._loop.close()

    async def _start(self) -> None:
        self._runner = web.AppRunner(self.site.application(), access_log=None, handle_signals=False)
        await self._runner.setup()
        for host, address in self.resolve.items():
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((address, 0))
            self._sockets.append(sock)
            self.ports[host] = sock.getsockname()[1]
            await web.SockSite(self._runner, sock, backlog=1024).start()
        self.proxy = ForwardProxy(self.resolve, egress=self.site.egress)
        await self.proxy.__aenter__()

    async def _stop(self) -> None:
        if self.proxy is not None:
            await self.proxy.__aexit__(None, None, None)
        if self._runner is not None:
            await self._runner.cleanup()
        for sock in self._sockets:
            sock.close()
