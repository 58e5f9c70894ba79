"""The fetcher every task of a worker shares: one pooled aiohttp connector, per-domain
sessions (cookies, logins), redirects followed hop by hop, robots.txt, proxies, size caps.

Each hop is checked before it is requested (the caller's scope and politeness check, the
SSRF guard, then robots.txt), so a redirect can never lead the crawler where it may not go;
the connector's resolver refuses names that resolve to addresses the guard refuses (guard.py).

Pacing (politeness.py) reserves each hop's send time before the hop; the hop holds that
`SendSlot` and confirms it right before its bytes are written, once the connection is in
hand, so a request that got there late (a slow event loop, a new TCP connection) never goes
out on a time another request may be counting from.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import functools
import itertools
import resource
import socket
import ssl
import struct
import time
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from http.cookies import Morsel
from typing import Any, Protocol
from urllib.parse import urljoin, urlsplit

import aiohttp
from aiohttp._cookie_helpers import parse_set_cookie_headers
from aiohttp.client_proto import ResponseHandler
from aiohttp.connector import AddrInfoType, Connection
from aiohttp.typedefs import LooseCookies
from yarl import URL

from ..grouping import is_public_suffix
from ..observe.logs import redact, secret_header
from ..observe.metrics import worker_metrics
from .answers import PendingAnswers
from .decoding import ACCEPT_ENCODING, decode_content
from .errors import FetchError, Reason, Throttled
from .guard import AddressGuard, BlockedAddress, GuardedResolver, literal_address
from .proxies import Proxies
from .resolver import StaticResolver
from .response import Response
from .robots import MAX_ROBOTS_BYTES, RobotsCache
from .settings import FetchSettings
from .urls import canonicalize

HopCheck = Callable[[str], Awaitable[None]]


class SendSlot(Protocol):
    """The time a request may be sent at, reserved before it was (Politeness.pace)."""

    async def confirm(self) -> None:
        """Returns when the request may be written at once: called right before its bytes
        are, after the connection is in hand, with nothing awaited between the two. Raises
        Throttled if it may not be sent soon enough."""

    def answered(self, status: int, retry_after: str | None) -> None:
        """Called as soon as the response's head is in, before its body is read."""


#: `pace` runs right before each hop: it waits for the hop's turn and may hand back the
#: slot the hop confirms right before writing.
Pacer = Callable[[str], Awaitable[SendSlot | None]]
LoginHook = Callable[["Session"], Awaitable[None]]
#: Whether a hop may go with the crawl's credentials (`Fetcher.fetch`'s `credentials`).
CredentialCheck = Callable[[str], bool]
ExpiredTest = Callable[[Response], bool]

READ_CHUNK = 64 * 1024
#: Bounds on a response's head (aiohttp's defaults, made ours): the status line and each
#: header line at most MAX_LINE bytes, at most MAX_HEADERS headers, so at most about 1 MB.
MAX_LINE = 8190
MAX_HEADERS = 128
#: How many hosts a proxied fetcher remembers the guard's verdict on (for `dns_ttl`).
MAX_GUARD_CACHE = 10_000
#: A new login that did not help (the page came back logged out again: a page that is
#: forbidden, not a session that expired) is not tried again for that page for this long;
#: other pages still log in again when they find the session expired.
FUTILE_LOGIN_QUIET = 60.0
MAX_FUTILE_URLS = 10_000
#: An idle connection is kept this long for the host's next request (aiohttp: 15 s). A broad
#: crawl touches hundreds of hosts a second, mostly once: idle connections, which `connections`
#: does not count, then held thousands of descriptors.
KEEPALIVE_SECONDS = 5.0
#: A fetcher raises its process's soft limit of open files to this (or the hard limit): the
#: usual soft limit, 1024, is far less than a crawler's connections.
OPEN_FILES = 65_536
#: How many proxies a hop tries when its proxy cannot be reached.
MAX_PROXY_TRIES = 3
#: After a failed login, its domain's requests fail at once (no login, no request) for this
#: long, doubled with each failure in a row up to LOGIN_RETRY_CAP: a site that refuses the
#: password is not asked again by every task, which could lock the account.
LOGIN_RETRY = 5.0
LOGIN_RETRY_CAP = 300.0
#: Headers of a request's body, dropped with it when a redirect turns the request into a GET.
BODY_HEADERS = frozenset(
    {"content-type", "content-length", "content-encoding", "content-language", "content-location"}
)
#: Headers a redirect to another origin does not carry, whether the caller or the session
#: (a login hook's token) set them: those carrying credentials (`credential`, the list the
#: logs mask: Authorization, Cookie, and every header named as a secret, X-Api-Key); the
#: cookie jar still sends the new origin its own.
credential = secret_header


def body_header(name: str) -> bool:
    return name.lower() in BODY_HEADERS


def logged_out(response: Response) -> bool:
    """The usual signs of an expired session: 401/403, or a redirect to a login page."""
    if response.status in (401, 403):
        return True
    return any(
        hop.is_redirect and "login" in (hop.header("Location") or "").lower()
        for hop in response.chain
    )


@dataclass(frozen=True, kw_only=True, slots=True)
class Login:
    """Signs in to a domain: `perform(session)` runs before the domain's first request and
    again whenever `expired(response)` says a response came back logged out."""

    perform: LoginHook
    expired: ExpiredTest = logged_out


def _in_domain(host: str, domain: str) -> bool:
    return host == domain or host.endswith("." + domain)


class CookieJar(aiohttp.CookieJar):
    """aiohttp's jar, but a cookie for a public suffix (Domain=com, co.uk, github.io, test) is
    refused: one site would set it for every other, as the shared session serves them all.
    (A host that is itself such a name may still set a cookie for itself.)"""

    def update_cookies(self, cookies: LooseCookies, response_url: URL = URL()) -> None:
        pairs = cookies.items() if isinstance(cookies, Mapping) else cookies
        host = response_url.raw_host or ""
        kept = [
            (name, value)
            for name, value in pairs
            if not isinstance(value, Morsel) or not _for_others(value["domain"], host)
        ]
        super().update_cookies(kept, response_url)

    def update_cookies_from_headers(self, headers: Sequence[str], response_url: URL) -> None:
        host = response_url.raw_host or ""
        # Read as aiohttp reads them (the last Domain counts, quotes hide one): by the text,
        # `a=1; Domain=a.co.uk; Domain=co.uk` would pass.
        kept = [
            header
            for header in headers
            if "omain" not in header.lower()
            or not any(
                _for_others(morsel["domain"], host)
                for _, morsel in parse_set_cookie_headers([header])
            )
        ]
        super().update_cookies_from_headers(kept, response_url)


def _for_others(domain: str, host: str) -> bool:
    """Whether a cookie's Domain attribute names a public suffix other than its host."""
    domain = domain.strip().strip(".").lower()
    return bool(domain) and domain != host.lower() and is_public_suffix(domain)


class Session:
    """The cookies (and login) of one domain ("" for the session of every other host); what
    a login hook signs in with. Headers it sets on `client` go only to its domain's hosts,
    and not from https to http."""

    def __init__(
        self, fetcher: Fetcher, client: aiohttp.ClientSession, login: Login | None, domain: str
    ) -> None:
        self.fetcher = fetcher
        self.client = client
        self.login = login
        self.domain = domain
        self.generation = 0  # counts logins, so concurrent expiries log in only once
        self._lock = asyncio.Lock()
        self._failed: FetchError | None = None  # the last login's, while no login worked
        self._failures = 0
        self._retry_at = 0.0  # epoch seconds: no login is tried before then
        # URL -> until when (monotonic) its logged-out answers are taken as they are
        self.futile: dict[str, float] = {}

    async def get(self, url: str, **options: Any) -> Response:
        return await self.fetcher.request(self, "GET", url, **options)

    async def post(self, url: str, **options: Any) -> Response:
        return await self.fetcher.request(self, "POST", url, **options)

    async def ensure_login(self, seen_generation: int | None) -> None:
        """Logs in if nobody has yet (None), or if still at `seen_generation` (expired).
        FetchError(LOGIN_FAILED) with `until`, when a login may be tried again: until then,
        without trying (LOGIN_RETRY)."""
        if self.login is None:
            return
        async with self._lock:
            if seen_generation is None and self.generation > 0:
                return
            if seen_generation is not None and self.generation != seen_generation:
                return
            failed = self._failed
            if failed is not None and time.time() < self._retry_at:
                detail = f"{failed.detail} (not tried again before {self._retry_at:.0f})"
                raise FetchError(Reason.LOGIN_FAILED, failed.url, detail, until=self._retry_at)
            try:
                await self.login.perform(self)
            except FetchError as exc:
                if exc.reason is Reason.BLOCKED:
                    raise  # a login at a refused address is a setting to fix, not to retry
                self._failures += 1
                pause = min(LOGIN_RETRY_CAP, LOGIN_RETRY * 2 ** (self._failures - 1))
                self._retry_at = time.time() + pause
                self._failed = FetchError(
                    Reason.LOGIN_FAILED, exc.url, str(exc), until=self._retry_at
                )
                raise self._failed from exc
            self.generation += 1
            self._failed, self._failures = None, 0

    def cookies(self) -> dict[str, str]:
        return {cookie.key: cookie.value for cookie in self.client.cookie_jar}


class Fetcher:
    """Use as an async context manager, or close with `aclose()`."""

    def __init__(self, settings: FetchSettings | None = None) -> None:
        self.settings = settings or FetchSettings()
        self._logins: dict[str, Login] = {}
        self._sessions: dict[str, Session] = {}
        self._anonymous: Session | None = None  # `credentials` refused: no cookies, no login
        self._connector: aiohttp.TCPConnector | None = None
        self._resolver: GuardedResolver | None = None  # the connector's: proxies pass
        self._targets: GuardedResolver | None = None  # checks where proxied requests go
        self.guard = AddressGuard(self.settings.allow_networks)
        self._verdicts: dict[str, tuple[float, str | None]] = {}  # proxied host -> refusal
        self._proxies = Proxies(self.settings.proxies) if self.settings.proxies else None
        self._sent: dict[str, float] = {}  # host -> when the last request to it was sent
        self._dns_cleared = time.monotonic()
        self._slot: ContextVar[SendSlot | None] = ContextVar("send_slot", default=None)
        # Whether the hop being sent is one credentials may not go with (`_trusted`).
        self._untrusted: ContextVar[bool] = ContextVar("untrusted", default=False)
        self._pending = PendingAnswers()
        # The hop `_send_once` is doing: where its request went (host, connection).
        self._hop: ContextVar[list[tuple[str, ResponseHandler]] | None] = ContextVar(
            "hop", default=None
        )
        self.robots = RobotsCache(
            self._fetch_robots,
            self.settings.user_agent,
            ttl=self.settings.robots_ttl,
            retry=self.settings.robots_retry,
            kept_bytes=min(MAX_ROBOTS_BYTES, self.settings.max_bytes),
            proxied=bool(self.settings.proxies),
        )

    async def __aenter__(self) -> Fetcher:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        sessions, self._sessions = list(self._sessions.values()), {}
        if self._anonymous is not None:
            sessions.append(self._anonymous)
            self._anonymous = None
        for session in sessions:
            await session.client.close()
        if self._connector is not None:
            await self._connector.close()
            self._connector = None

    def add_login(self, domain: str, login: Login) -> None:
        """Requests to `domain` and its sub-domains use their own session, signed in by
        `login` once and again when it expires."""
        self._logins[domain.lower().strip(".")] = login

    # -- sessions -------------------------------------------------------------------------

    def _connector_now(self) -> aiohttp.TCPConnector:
        if self._connector is None or self._connector.closed:
            settings = self.settings
            fallback = None if settings.resolve_only else aiohttp.ThreadedResolver()
            proxies = (URL(proxy).raw_host or "" for proxy in settings.proxies)
            names = StaticResolver(settings.resolve, fallback)
            self._resolver = GuardedResolver(names, self.guard, exempt=proxies)
            self._targets = GuardedResolver(names, self.guard)
            _raise_open_files_limit()
            self._connector = aiohttp.TCPConnector(
                limit=settings.connections,
                keepalive_timeout=KEEPALIVE_SECONDS,
                use_dns_cache=True,
                ttl_dns_cache=settings.dns_ttl,
                resolver=self._resolver,
                ssl=_tls(settings),
                socket_factory=_abortive_socket,
            )
        return self._connector

    async def _check_address(self, url: str, parsed: URL | None) -> None:
        """FetchError(BLOCKED) if `url` (`parsed`: as aiohttp will read it) names an address
        the guard refuses, or, through a proxy (which resolves the name itself), a name our
        resolver resolves to one. A name we cannot resolve is not sent to the proxy either
        (DNS). Direct requests to names are checked by the connector's resolver, on the
        addresses actually connected to."""
        if parsed is None:
            return  # aiohttp refuses it as an invalid URL
        try:
            host, port = parsed.raw_host, parsed.port or 0
        except ValueError:
            return
        if not host:
            return
        refusal = self.guard.check_literal(host)
        if refusal is None and self._proxies is not None and literal_address(host) is None:
            refusal = await self._proxied_refusal(host, port, url)
        if refusal is not None:
            raise FetchError(Reason.BLOCKED, url, refusal)

    async def _proxied_refusal(self, host: str, port: int, url: str) -> str | None:
        now = time.monotonic()
        cached = self._verdicts.get(host)
        if cached is not None and cached[0] > now:
            return cached[1]
        self._connector_now()
        assert self._targets is not None
        try:
            await self._targets.resolve(host, port)
            refusal = None
        except BlockedAddress as exc:
            refusal = str(exc)
        except OSError as exc:
            raise FetchError(Reason.DNS, url, f"{host}: {exc}") from exc
        if len(self._verdicts) >= MAX_GUARD_CACHE:
            self._verdicts.clear()
        self._verdicts[host] = (now + self.settings.dns_ttl, refusal)
        return refusal

    def session(self, url: str) -> Session:
        """The session for `url`'s host: its login domain's own (the most specific one, if
        more than one holds it), or the shared one."""
        domain = ""
        if self._logins:
            host = (urlsplit(url).hostname or "").lower()
            domain = max((d for d in self._logins if _in_domain(host, d)), key=len, default="")
        session = self._sessions.get(domain)
        if session is None:
            # unsafe: cookies of hosts named by address too (an intranet's, a login's);
            # each still goes only to the address that set it.
            client = self._client(CookieJar(unsafe=True))
            session = Session(self, client, self._logins.get(domain), domain)
            self._sessions[domain] = session
        return session

    def anonymous(self) -> Session:
        """The session of the hops that go without credentials (`fetch`'s `credentials`):
        it keeps and sends no cookie, and has no login."""
        if self._anonymous is None:
            self._anonymous = Session(self, self._client(aiohttp.DummyCookieJar()), None, "")
        return self._anonymous

    def _client(self, jar: aiohttp.abc.AbstractCookieJar) -> aiohttp.ClientSession:
        timeouts = self.settings.timeouts
        return aiohttp.ClientSession(
            connector=self._connector_now(),
            connector_owner=False,
            auto_decompress=False,
            timeout=aiohttp.ClientTimeout(
                total=timeouts.total, sock_connect=timeouts.connect, sock_read=timeouts.read
            ),
            max_line_size=MAX_LINE,
            max_field_size=MAX_LINE,
            max_headers=MAX_HEADERS,
            headers={
                "User-Agent": self.settings.user_agent,
                "Accept-Encoding": ACCEPT_ENCODING,
            },
            cookie_jar=jar,
            request_class=self._request_class,
        )

    def last_sent(self, host: str) -> float | None:
        """When (epoch seconds) this fetcher last sent a request to `host`, robots.txt
        requests included; None if never (or before the time given `forget_sent_before`)."""
        return self._sent.get(host)

    def forget_sent_before(self, moment: float) -> None:
        """Drops the send times before `moment` (epoch seconds), so that a crawl over
        millions of hosts keeps those of the hosts it paces now, not of every host it saw."""
        forget_before(self._sent, moment)  # in place: the sessions' request class holds it

    def _clear_dns_cache_now_and_then(self) -> None:
        """aiohttp keeps a resolved name until it is looked up again after its TTL: a crawl
        over millions of hosts would keep every one. Cleared each TTL, the cache holds the
        hosts of the last two TTLs, and an active host is resolved at most once more a TTL."""
        now = time.monotonic()
        if now - self._dns_cleared >= self.settings.dns_ttl and self._connector is not None:
            self._connector.clear_dns_cache()
            self._dns_cleared = now

    @contextmanager
    def _sending_on(self, slot: SendSlot | None) -> Iterator[None]:
        """The requests sent meanwhile by this task (robots.txt's and its redirects when
        it is fetched for this hop) confirm `slot` right before they are written."""
        token = self._slot.set(slot)
        try:
            yield
        finally:
            self._slot.reset(token)

    @functools.cached_property
    def _request_class(self) -> type[aiohttp.ClientRequest]:
        """aiohttp's request, confirming its hop's send slot right before its bytes are
        written (the connection is in hand by then; a GET's head is written within
        `super().send`, with nothing awaited between), and noting when they went out, right
        after. Cheaper than a TraceConfig, which costs every request a dozen signal
        dispatches."""
        sent = self._sent
        current_slot = self._slot
        pending = self._pending
        current_hop = self._hop
        untrusted = self._untrusted

        class NotedRequest(aiohttp.ClientRequest):
            def update_headers(self, headers: Any) -> None:
                super().update_headers(headers)  # the caller's and the session's, merged
                if untrusted.get():
                    for name in [name for name in self.headers if credential(name)]:
                        self.headers.popall(name, None)

            async def send(self, conn: Connection) -> aiohttp.ClientResponse:
                # Two loop turns before anything is written, so a timer due by now runs
                # first: the worker's lease watchdog, after the process was stopped or
                # starved past a lease, cancels the request here rather than letting it go
                # out on a slot another worker holds by then (one turn may not do: the
                # task's next step can come before the turn's due timers).
                await asyncio.sleep(0)
                await asyncio.sleep(0)
                host = (self.url.host or "").lower()
                await pending.before_send(host)  # a 429 already in pauses the group first
                slot = current_slot.get()
                if slot is not None:
                    await slot.confirm()
                protocol = conn.protocol
                if protocol is None or not protocol.is_connected():
                    raise _StaleConnection  # the server closed it meanwhile: nothing was sent
                response = await super().send(conn)
                sent[host] = time.time()
                hop = current_hop.get()
                if hop is not None:
                    pending.sent(host, protocol)
                    hop.append((host, protocol))
                return response

        return NotedRequest

    # -- fetching -------------------------------------------------------------------------

    async def fetch(
        self,
        url: str,
        *,
        method: str = "GET",
        data: Mapping[str, str] | bytes | None = None,
        headers: Mapping[str, str] | None = None,
        check: HopCheck | None = None,
        robots: bool | None = None,
        pace: Pacer | None = None,
        credentials: CredentialCheck | None = None,
    ) -> Response:
        """Fetches `url`, following redirects: `check` then robots.txt approve each hop
        first, and `pace` runs right before each hop is sent (after any robots.txt request
        it caused; the slot it returns is confirmed right before the hop's bytes are
        written). `credentials`: which hops may go with the crawl's credentials (see
        `request`); None: every hop, as the sessions have them. Raises FetchError with a
        Reason; a response of any status is returned."""
        self._clear_dns_cache_now_and_then()
        credited = credentials is None or credentials(url)
        session = self.session(url) if credited else self.anonymous()
        if session.login is not None:
            await _login_for(url, session.ensure_login(None))
        generations = self._login_generations()
        send = functools.partial(
            self.request,
            session,
            method,
            url,
            data=data,
            headers=headers,
            check=check,
            robots=robots,
            pace=pace,
            credentials=credentials,
        )
        response = await send()
        expired = self._expired_session(url, response, credentials)
        if expired is not None and expired.login is not None:
            seen = generations.get(expired.domain, expired.generation)
            await _login_for(url, expired.ensure_login(seen))
            response = await send()
            login = expired.login
            if any(  # forbidden, not logged out: no login per fetch
                self.session(answer.url) is expired and login.expired(answer)
                for answer in response.chain
            ):
                if len(expired.futile) >= MAX_FUTILE_URLS:
                    expired.futile.clear()
                expired.futile[url] = time.monotonic() + FUTILE_LOGIN_QUIET
        return response

    def _login_generations(self) -> dict[str, int]:
        """Each login session's count of logins, by domain, before a fetch."""
        if not self._logins:
            return {}
        return {domain: s.generation for domain, s in self._sessions.items() if s.login}

    def _expired_session(
        self, url: str, response: Response, credentials: CredentialCheck | None
    ) -> Session | None:
        """The session of the first of `response`'s hops whose login says its answer (with
        the redirects before it) came back logged out; None while such answers to `url` are
        taken as they are (FUTILE_LOGIN_QUIET). Each session is judged by its own hop: the
        whole chain would have a.test's session, first on a.test/go -> b.test/members, log
        in again for b.test's login page. Hops that went without credentials have none."""
        if not self._logins:
            return None
        now = time.monotonic()
        for answer in response.chain:  # each hop's answer holds the hops before it
            if credentials is not None and not credentials(answer.url):
                return None  # this hop and those after it went without credentials
            session = self.session(answer.url)
            login = session.login
            if login is not None and login.expired(answer):
                return session if now >= session.futile.get(url, 0.0) else None
        return None

    async def request(
        self,
        session: Session,
        method: str,
        url: str,
        *,
        data: Mapping[str, str] | bytes | None = None,
        headers: Mapping[str, str] | None = None,
        check: HopCheck | None = None,
        robots: bool | None = None,
        follow: bool = True,
        pace: Pacer | None = None,
        keep: int | None = None,
        credentials: CredentialCheck | None = None,
    ) -> Response:
        """One request through `session` and its redirects; no login handling. The total
        timeout bounds the time spent sending and receiving all the hops together. `keep`:
        a body's first `keep` bytes are read and the rest left unread, where it would be
        TOO_LARGE over max_bytes. `credentials`: the hops go with the crawl's credentials
        (cookies, a login's, the caller's credential headers) until the first one it
        refuses; that hop and every later one go through the anonymous session, without
        any, and keep no cookie (as a browser's cross-site request with SameSite=Strict
        cookies)."""
        use_robots = self.settings.robots if robots is None else robots
        history: list[Response] = []
        # A URL asked again is a loop, unless an answer since it was asked set a cookie (a
        # site that sets one and redirects to the same page: the way in). URL -> its hop.
        visited = {url: 0}
        cookie_hop = -1  # the last hop whose answer set a cookie
        current = url
        first = _parsed(url)
        trusted = True  # once a hop is not, no later one is (as aiohttp and browsers do)
        credited = True  # likewise for `credentials`
        total = self.settings.timeouts.total
        while True:
            spent = sum(hop.elapsed for hop in history)
            try:
                if check is not None:
                    await check(current)
                parsed = _parsed(current)
                credited = credited and (credentials is None or credentials(current))
                trusted = trusted and credited and _trusted(session, first, parsed)
                # A hop into another login domain goes with that domain's session, signed in.
                if not credited:
                    hop_session = self.anonymous()
                elif history and self._logins:
                    hop_session = self.session(current)
                else:
                    hop_session = session
                if hop_session is not session and hop_session.login is not None:
                    await _login_for(current, hop_session.ensure_login(None))
                await self._check_address(current, parsed)
                if use_robots:
                    slot = None
                    if pace is not None and not await self.robots.recall(current):
                        slot = await pace(current)  # robots.txt is paced like any request
                    with self._sending_on(slot):
                        await self.robots.check(current)
                # Without `pace`, a hop goes on the slot this task holds, if any: robots.txt
                # fetched for a paced hop is paced by that hop's `pace`.
                slot = self._slot.get() if pace is None else await pace(current)
                if spent >= total:
                    raise FetchError(
                        Reason.TIMEOUT, current, f"redirects took over the total timeout {total:g}s"
                    )
                budget = total - spent
                # The caller's credentials go where `trusted` says; a session's own (a login
                # hook's token) to its domain, or as the caller's when it is the same session.
                if hop_session is session:
                    own = trusted
                else:
                    own = credited and _trusted(hop_session, first, parsed)
                hop_headers = headers if trusted else _without(headers, credential)
                untrusted = self._untrusted.set(not own)
                try:
                    with self._sending_on(slot):
                        response = await self._send(
                            hop_session.client,
                            method,
                            current,
                            parsed,
                            data,
                            hop_headers,
                            budget,
                            keep,
                        )
                finally:
                    self._untrusted.reset(untrusted)
            except Throttled as exc:
                raise Throttled(
                    exc.url, exc.until, exc.detail, responses=history, answered=exc.answered
                ) from exc
            except FetchError as exc:
                raise FetchError(
                    exc.reason, exc.url, exc.detail, responses=history, until=exc.until
                ) from exc
            response = _with_history(response, history)
            if not (follow and response.is_redirect):
                return response
            history.append(response)
            if response.header("Set-Cookie") is not None:
                cookie_hop = len(history) - 1
            location = _header_text(response.header("Location") or "")
            target = _redirect_target(current, location, history)
            if cookie_hop < visited.get(target, cookie_hop):
                raise FetchError(
                    Reason.REDIRECT_LOOP,
                    url,
                    f"{current} redirects back to {target}",
                    responses=history,
                )
            if len(history) > self.settings.max_redirects:
                raise FetchError(
                    Reason.TOO_MANY_REDIRECTS,
                    url,
                    f"more than {self.settings.max_redirects} redirects",
                    responses=history,
                )
            visited[target] = len(history)
            if (response.status == 303 and method != "HEAD") or (
                response.status in (301, 302) and method == "POST"
            ):
                method, data = "GET", None  # as browsers do (the Fetch standard)
                headers = _without(headers, body_header)
            if data is not None and not _trusted(session, first, _parsed(target)):
                # A 307/308 sends the body again, and no credential can be taken out of a
                # body (a login form's password): not to another origin, then.
                raise FetchError(
                    Reason.BAD_RESPONSE,
                    url,
                    f"a {response.status} to {redact(target)} would send it the request's body",
                    responses=history,
                )
            current = target

    async def _fetch_robots(self, url: str) -> Response:
        keep = self.robots.kept_bytes
        return await self.request(self.session(url), "GET", url, robots=False, keep=keep)

    async def _send(
        self,
        client: aiohttp.ClientSession,
        method: str,
        url: str,
        target: URL | None,
        data: Mapping[str, str] | bytes | None,
        headers: Mapping[str, str] | None,
        budget: float,
        keep: int | None = None,
    ) -> Response:
        """One hop (see `_send_once`), tried again once on another connection when the
        pooled one it got was closed by the server before anything was written, and through
        the next proxy (at most MAX_PROXY_TRIES) when its proxy could not be reached."""
        proxies = self._proxies
        for tries in itertools.count(1):
            proxy = proxies.next() if proxies is not None else None
            try:
                for _ in range(2):
                    with contextlib.suppress(_StaleConnection):
                        response = await self._send_once(
                            client, method, url, target, data, headers, budget, keep, proxy
                        )
                        if proxies is not None and proxy is not None:
                            proxies.worked(proxy)
                        return response
            except _ProxyUnreachable as exc:
                assert proxies is not None and proxy is not None
                proxies.failed(proxy)
                if tries >= min(len(proxies), MAX_PROXY_TRIES):
                    noun = "proxy" if tries == 1 else "proxies"
                    what = f"{tries} {noun} could not be reached; the last: {exc}"
                    raise FetchError(Reason.PROXY, url, what) from exc
                continue
            raise FetchError(
                Reason.NETWORK, url, "the server closed the connection before the request"
            )
        raise AssertionError("unreachable")

    async def _send_once(
        self,
        client: aiohttp.ClientSession,
        method: str,
        url: str,
        target: URL | None,
        data: Mapping[str, str] | bytes | None,
        headers: Mapping[str, str] | None,
        budget: float,
        keep: int | None,
        proxy: str | None,
    ) -> Response:
        """One hop, done within `budget` seconds, its body (decoded too) within max_bytes,
        or its first `keep` bytes as received; `target` is `url` parsed (None if it cannot
        be: aiohttp then says why). _ProxyUnreachable if `proxy` could not be reached."""
        max_bytes = self.settings.max_bytes
        timeouts = self.settings.timeouts
        timeout = aiohttp.ClientTimeout(
            total=budget, sock_connect=timeouts.connect, sock_read=timeouts.read
        )
        started = time.monotonic()
        hop: list[tuple[str, ResponseHandler]] = []
        token = self._hop.set(hop)
        try:
            async with client.request(
                method,
                url if target is None else target,
                data=data,
                headers=headers,
                allow_redirects=False,
                proxy=proxy,
                timeout=timeout,
            ) as answer:
                fetched_at = time.time()
                slot = self._slot.get()
                if slot is not None:
                    slot.answered(answer.status, answer.headers.get("Retry-After"))
                self._hop_done(hop)
                length = answer.content_length
                if keep is None and length is not None and length > max_bytes:
                    raise FetchError(Reason.TOO_LARGE, url, f"Content-Length {length}")
                raw = bytearray()
                async for chunk in answer.content.iter_chunked(READ_CHUNK):
                    raw += chunk
                    if keep is not None and len(raw) >= keep:
                        del raw[keep:]
                        break
                    if len(raw) > max_bytes:
                        raise FetchError(Reason.TOO_LARGE, url, f"body over {max_bytes} bytes")
                worker_metrics().record_fetch(answer.status, len(raw))
                received = bytes(raw)
                del raw  # one copy of the body in memory, not two
                encoding = answer.headers.get("Content-Encoding")
                body = decode_content(received, encoding, max_bytes=max_bytes, url=url)
                version = answer.version
                return Response(
                    url=url,
                    status=answer.status,
                    # aiohttp decodes it as UTF-8 (surrogates for the rest): back to bytes,
                    # then Latin-1 like the headers, so any byte the server sent survives.
                    reason=(answer.reason or "")
                    .encode("utf-8", "surrogateescape")
                    .decode("latin-1"),
                    http_version=f"HTTP/{version.major}.{version.minor}" if version else "HTTP/1.1",
                    headers=tuple(
                        (k.decode("latin-1"), v.decode("latin-1")) for k, v in answer.raw_headers
                    ),
                    raw=received,
                    body=body,
                    fetched_at=fetched_at,
                    elapsed=time.monotonic() - started,
                )
        except (FetchError, _StaleConnection):
            raise
        except aiohttp.ClientProxyConnectionError as exc:
            raise _ProxyUnreachable(_one_line(str(exc))) from exc
        except TimeoutError as exc:
            total = timeouts.total
            what = str(exc) or f"no complete answer within the total timeout of {total:g}s"
            if budget < total:
                what += f" ({budget:.3g}s were left after the redirects)"
            raise FetchError(Reason.TIMEOUT, url, what) from exc
        except Exception as exc:
            raise _translate(exc, url) from exc
        finally:
            self._hop_done(hop)
            self._hop.reset(token)

    def _hop_done(self, hop: list[tuple[str, ResponseHandler]]) -> None:
        """The hop's answer head was handled, or the hop ended without one."""
        for host, protocol in hop:
            self._pending.done(host, protocol)
        hop.clear()


class _StaleConnection(Exception):
    """A pooled connection the server closed while the request waited to be written."""


class _ProxyUnreachable(Exception):
    """No connection to the hop's proxy: nothing was sent, another proxy may take it."""


def _raise_open_files_limit() -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = OPEN_FILES if hard == resource.RLIM_INFINITY else min(OPEN_FILES, hard)
    if soft != resource.RLIM_INFINITY and soft < wanted:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))


async def _login_for(url: str, login: Awaitable[None]) -> None:
    """Awaits `login`, for `url`: a login that failed fails the page (its group is paused
    until the login may be tried again), not the login page."""
    try:
        await login
    except FetchError as exc:
        if exc.reason is not Reason.LOGIN_FAILED:
            raise
        raise FetchError(exc.reason, url, exc.detail, until=exc.until) from exc


def _without(
    headers: Mapping[str, str] | None, dropped: Callable[[str], bool]
) -> Mapping[str, str] | None:
    """`headers` but those whose name is `dropped`."""
    if not headers:
        return headers
    return {name: value for name, value in headers.items() if not dropped(name)}


def _trusted(session: Session, first: URL | None, hop: URL | None) -> bool:
    """Whether a request's credential headers may go with its hop to `hop`: the origin of
    its first URL, `first`, or a host of the session's login domain reached without going
    from https to http."""
    if first is None or hop is None:
        return False
    try:
        if (hop.scheme, hop.host, hop.port) == (first.scheme, first.host, first.port):
            return True
        host = (hop.host or "").lower()
    except ValueError:
        return False
    downgrade = first.scheme == "https" and hop.scheme != "https"
    return bool(session.domain) and _in_domain(host, session.domain) and not downgrade


def _parsed(url: str) -> URL | None:
    """`url` as aiohttp reads it; None if it cannot (aiohttp then refuses it itself)."""
    try:
        return URL(url)
    except (ValueError, TypeError):
        return None


def _tls(settings: FetchSettings) -> ssl.SSLContext | bool:
    """What the connector verifies certificates with: the system's CAs, `ca_file`'s, or none."""
    if not settings.verify_tls:
        return False
    if settings.ca_file is None:
        return True
    return ssl.create_default_context(cafile=settings.ca_file)


def forget_before(times: dict[str, float], moment: float) -> None:
    """Drops, in place, the entries of `times` (a host's or group's last send, in epoch
    seconds) from before `moment`."""
    for name in [name for name, at in times.items() if at < moment]:
        del times[name]


def _header_text(value: str) -> str:
    """A header value as text: kept as Latin-1 (so every byte survives), but a non-ASCII one
    that is valid UTF-8, as a Location nearly always is, read as UTF-8, as browsers do."""
    if value.isascii():
        return value
    try:
        return value.encode("latin-1").decode("utf-8")
    except UnicodeError:
        return value


def _redirect_target(current: str, location: str, history: list[Response]) -> str:
    """Where a redirect leads, canonical (so without its fragment, and escaped as a link to
    it would be); BAD_RESPONSE if not an http(s) URL."""
    try:
        target = urljoin(current, location).split("#", 1)[0]
        parts = urlsplit(target)
        parts.port  # noqa: B018 - raises ValueError for a port out of range
    except ValueError as exc:
        raise FetchError(
            Reason.BAD_RESPONSE,
            current,
            _one_line(f"redirect to an invalid URL {location!r}: {exc}"),
            responses=history,
        ) from exc
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise FetchError(
            Reason.BAD_RESPONSE,
            current,
            _one_line(f"redirect to a URL that is not http(s): {location!r}"),
            responses=history,
        )
    return canonicalize(target) or target


def _with_history(response: Response, history: list[Response]) -> Response:
    if not history:
        return response
    return Response(
        url=response.url,
        status=response.status,
        reason=response.reason,
        http_version=response.http_version,
        headers=response.headers,
        raw=response.raw,
        body=response.body,
        fetched_at=response.fetched_at,
        elapsed=response.elapsed,
        history=tuple(history),
    )


def _one_line(text: str, limit: int = 300) -> str:
    """aiohttp's parser messages span lines and quote whole headers: one line, capped."""
    line = " ".join(text.split())
    return line if len(line) <= limit else line[: limit - 3] + "..."


def _translate(exc: Exception, url: str) -> FetchError:
    """aiohttp's and the OS's errors, as the reasons a page record names."""
    detail = _one_line(str(exc) or type(exc).__name__)
    if isinstance(exc, TimeoutError):
        return FetchError(Reason.TIMEOUT, url, detail)
    if isinstance(exc, aiohttp.ClientConnectorError) and isinstance(exc.os_error, BlockedAddress):
        return FetchError(Reason.BLOCKED, url, str(exc.os_error))
    if isinstance(exc, aiohttp.ClientConnectorDNSError):
        return FetchError(Reason.DNS, url, detail)
    if isinstance(exc, aiohttp.ClientConnectorCertificateError):
        error = exc.certificate_error
        why = getattr(error, "verify_message", None) or str(error)
        return FetchError(Reason.TLS, url, f"certificate refused: {why} ({exc.host}:{exc.port})")
    if isinstance(exc, aiohttp.ClientSSLError):
        return FetchError(Reason.TLS, url, detail)
    if isinstance(exc, aiohttp.ClientHttpProxyError):
        return FetchError(Reason.NETWORK, url, f"the proxy refused: {exc.status} {exc.message}")
    if isinstance(exc, aiohttp.ClientResponseError):
        # Raised by the parser: not HTTP, a bad status line, headers too long or too many.
        return FetchError(Reason.BAD_RESPONSE, url, _one_line(exc.message))
    if isinstance(exc, aiohttp.ServerDisconnectedError):
        what = "the server closed the connection before a complete answer"
        return FetchError(Reason.NETWORK, url, what)
    if isinstance(exc, aiohttp.ClientConnectorError):
        if exc.os_error.errno == errno.ECONNREFUSED:
            return FetchError(Reason.REFUSED, url, detail)
        return FetchError(Reason.CONNECT, url, detail)
    if isinstance(exc, aiohttp.ClientPayloadError):
        return FetchError(Reason.BROKEN_BODY, url, detail)
    if isinstance(exc, aiohttp.ClientError | OSError):
        return FetchError(Reason.NETWORK, url, detail)
    if isinstance(exc, aiohttp.InvalidURL | ValueError):
        return FetchError(Reason.NETWORK, url, f"invalid request: {detail}")
    raise exc


def _abortive_socket(addr_info: AddrInfoType) -> socket.socket:
    """A socket whose close discards what it has not sent yet (SO_LINGER 0: a reset, not a
    FIN after the data), so a request given up on (its task cancelled, its lease lost) never
    reaches the server later, when the link comes back, on a slot that is no longer its own."""
    family, kind, proto, _, _ = addr_info
    sock = socket.socket(family=family, type=kind, proto=proto)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    return sock
