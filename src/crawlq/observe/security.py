"""The dashboard's guard: an optional access token on every request, a session cookie, and
CSRF tokens for actions.

With a token set, a request passes with ``Authorization: Bearer <token>`` (for scrapers and
scripts) or the ``crawlq_token`` login cookie. Logging in (the form, or opening any page with
``?token=<token>``, which then redirects to the same page without it, out of the address bar
and history) sets that cookie (HttpOnly, SameSite=Strict, LOGIN_SECONDS; Secure when served
over HTTPS): an expiry and an HMAC of it under a secret made at start-up, never the token
itself, since a browser sends the cookies of 127.0.0.1 to every port of it, so to any other
local service too. Everything else gets 401 and a login form. Logging out (a POST to
LOGOUT_PATH, an action like any other: see below) clears the cookie, voids it in this
dashboard should a copy be sent again, and starts a new session, so the CSRF tokens of the
pages still open are void too.

Actions are POST forms carrying ``csrf``: an HMAC of the browser's session cookie under a
secret made at start-up. Another site can make a browser post, but cannot read the token.

Before any of that, with a token or without, a request another web page made is refused (403;
Guard.foreign): one whose ``Sec-Fetch-Site`` is ``cross-site`` or ``same-site`` (another port
of 127.0.0.1 is the same site), or whose Origin names another host. Such a page cannot read
the answer, but each read it asks for costs the backend (on Redis, an element's page scans
every group). Only a link the user clicked passes (a top-level GET navigation with
``Sec-Fetch-User: ?1``), so that a runbook's or an alert's link opens the page. A request
without Sec-Fetch-* headers (Prometheus, curl, scripts) is no browser's and passes.

Wrong tokens (the login form, ``?token=``, a Bearer) are limited per client address
(LoginLimit): past LOGIN_FAILURES in LOGIN_WINDOW seconds, every token that address gives,
right or wrong (or the answer would tell a right guess), gets 429 with Retry-After; past
LOGIN_FAILURES_ALL from all addresses together, every address's, since a local process can
claim any address in X-Forwarded-For, which uvicorn believes of 127.0.0.1.
"""

from __future__ import annotations

import hashlib
import hmac
import html
import itertools
import math
import re
import secrets
import time
from collections import OrderedDict, deque
from collections.abc import Callable
from typing import Any
from urllib.parse import parse_qsl, quote, urlencode

from starlette.datastructures import MutableHeaders
from starlette.requests import cookie_parser
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ..errors import ConfigError

#: The login cookie (named as when it held the token, so that logging in again replaces an old
#: one): "<expiry>.<login>.<HMAC>", see Guard.login_cookie.
TOKEN_COOKIE = "crawlq_token"
#: How long a login lasts.
LOGIN_SECONDS = 12 * 3600
SESSION_COOKIE = "crawlq_session"
LOGIN_PATH = "/login"
LOGOUT_PATH = "/logout"
MAX_FORM_BYTES = 64 * 1024
#: Wrong tokens one client address may give in LOGIN_WINDOW seconds before it must wait.
LOGIN_FAILURES = 5
#: Wrong tokens all addresses together may give in LOGIN_WINDOW seconds.
LOGIN_FAILURES_ALL = 100
LOGIN_WINDOW = 60.0
#: Addresses whose wrong tokens are remembered (the latest to fail kept): memory stays bounded
#: however many addresses guess, and LOGIN_FAILURES_ALL holds for those forgotten.
LOGIN_ADDRESSES = 10_000
#: Sec-Fetch-Site values of a request another page made (another port of 127.0.0.1 is
#: same-site): refused. "same-origin", "none" (typed, a bookmark) and no header pass.
FOREIGN_SITES = ("cross-site", "same-site")


def cookies(scope: Scope) -> dict[str, str]:
    """The request's cookies, read pair by pair as browsers do: one that http.cookies cannot
    parse (``ajs_user={"id":1}``, set by another app on the host) hides none of the others."""
    found = [v.decode("latin-1") for k, v in scope.get("headers", []) if k == b"cookie"]
    return cookie_parser("; ".join(found))


def header(scope: Scope, name: bytes) -> str | None:
    for key, value in scope.get("headers", []):
        if key == name:
            return str(value.decode("latin-1"))
    return None


def cookie_header(scope: Scope, name: str, value: str, *, max_age: int | None = None) -> str:
    """A Set-Cookie value for the response to `scope`: Secure when the request came over
    HTTPS (through a proxy that says so), so that a browser never sends it over HTTP."""
    parts = [f"{name}={value}", "Path=/", "HttpOnly", "SameSite=Strict"]
    if scope.get("scheme") == "https":
        parts.append("Secure")
    if max_age is not None:
        parts.append(f"Max-Age={max_age}")
    return "; ".join(parts)


#: What a Location of this dashboard keeps as it is; anything else is percent-encoded.
_LOCATION_SAFE = "/?&=%+:;,@!$'()*~#"


def local_location(target: str) -> str:
    """`target` as the Location of a page of this dashboard: percent-encoded, so that no
    control character (CR LF would break the header), space or backslash reaches it (a
    browser reads /\\evil.test and /<TAB>/evil.test as //evil.test); "/" for anything but
    a path."""
    quoted = quote(target, safe=_LOCATION_SAFE)
    return quoted if quoted.startswith("/") and not quoted.startswith("//") else "/"


#: What a token may hold: the characters a cookie value may (RFC 6265), so it passes the
#: cookie, the Authorization header and the login form unchanged.
_TOKEN = re.compile(r"[\x21\x23-\x2b\x2d-\x3a\x3c-\x5b\x5d-\x7e]+")
MIN_TOKEN = 16
#: The fewest different characters a token may hold.
MIN_TOKEN_VARIETY = 6
MAKE_TOKEN = 'python -c "import secrets; print(secrets.token_urlsafe(32))"'
TOKEN_RULE = (
    f"at least {MIN_TOKEN} ASCII characters, {MIN_TOKEN_VARIETY} or more of them different,"
    " without spaces, quotes, commas, semicolons or backslashes, neither mostly a run"
    " (1234..., abcd..., aaaa...) nor one piece repeated (letmeinletmein)"
)


def weak_token(token: str) -> bool:
    """Whether `token` is one a person would type rather than a random one: fewer than
    MIN_TOKEN_VARIETY different characters, more than two thirds of its steps to the next
    character a repeat or a neighbour (1234567890123456, abcdefghijklmnop), or a piece
    repeated. A random token of MIN_TOKEN hex digits is refused about once in 30,000 (too
    few different ones); one of secrets.token_urlsafe, never in practice."""
    if len(set(token)) < MIN_TOKEN_VARIETY:
        return True
    steps = sum(1 for a, b in itertools.pairwise(token) if abs(ord(a) - ord(b)) <= 1)
    if steps * 3 > (len(token) - 1) * 2:
        return True
    size = len(token)
    return any(token == (token[:p] * size)[:size] for p in range(1, size // 2 + 1))


def check_token(token: str) -> str:
    """A dashboard token: see TOKEN_RULE; ConfigError otherwise, saying how to make a good
    one (the message never shows the token)."""
    if len(token) < MIN_TOKEN or not _TOKEN.fullmatch(token) or weak_token(token):
        raise ConfigError(f"the dashboard token must be {TOKEN_RULE}: make one with {MAKE_TOKEN}")
    return token


class LoginLimit:
    """Wrong tokens remembered per client address, by `clock` (seconds, any origin): the last
    `per_address` of each of the `addresses` latest to fail, and the last `overall` of all."""

    def __init__(
        self,
        clock: Callable[[], float] = time.monotonic,
        *,
        per_address: int = LOGIN_FAILURES,
        overall: int = LOGIN_FAILURES_ALL,
        window: float = LOGIN_WINDOW,
        addresses: int = LOGIN_ADDRESSES,
    ) -> None:
        self.clock = clock
        self.per_address = per_address
        self.window = window
        self.addresses = addresses
        self._failed: OrderedDict[str, deque[float]] = OrderedDict()
        self._all: deque[float] = deque(maxlen=overall)

    def wait(self, address: str) -> float:
        """Seconds before `address` may give a token again; 0 for now."""
        now = self.clock()
        waits = [0.0]
        for times in (self._failed.get(address), self._all):
            if times is not None and len(times) == times.maxlen:
                waits.append(times[0] + self.window - now)
        return max(waits)

    def failed(self, address: str) -> None:
        now = self.clock()
        times = self._failed.pop(address, None) or deque(maxlen=self.per_address)
        times.append(now)
        self._failed[address] = times  # the latest to fail, last
        while len(self._failed) > self.addresses:
            self._failed.popitem(last=False)
        self._all.append(now)

    def succeeded(self, address: str) -> None:
        """The right token from `address`: its wrong ones before are forgiven."""
        self._failed.pop(address, None)

    def __len__(self) -> int:
        return len(self._failed)


class Guard:
    """Checks the token and keeps a session for CSRF; one instance per dashboard. `clock`
    times the login limit only (tests move it)."""

    def __init__(self, token: str | None, *, clock: Callable[[], float] = time.monotonic) -> None:
        self.token = check_token(token) if token is not None else None
        self.secret = secrets.token_bytes(32)
        self._logged_out: dict[str, int] = {}  # login -> its expiry
        self.limit = LoginLimit(clock)

    def foreign(self, scope: Scope) -> bool:
        """Whether another web page made this request (see the module's doc): the one check
        of where a request comes from, for every route, reads and actions alike."""
        site = header(scope, b"sec-fetch-site")
        if site in FOREIGN_SITES and not _clicked_link(scope):
            return True
        origin = header(scope, b"origin")
        if origin and origin != "null":
            host = header(scope, b"host") or ""
            if origin.split("://", 1)[-1] != host:
                return True
        return False

    def csrf_for(self, session: str) -> str:
        return hmac.new(self.secret, session.encode(), hashlib.sha256).hexdigest()

    def csrf_ok(self, scope: Scope, form: dict[str, str]) -> bool:
        session = scope.get("state", {}).get("session", "")
        given = form.get("csrf", "")
        if not session or not given or not hmac.compare_digest(self.csrf_for(session), given):
            return False
        return not self.foreign(scope)

    def token_ok(self, candidate: str | None) -> bool:
        if self.token is None:
            return True
        return candidate is not None and hmac.compare_digest(
            candidate.encode(), self.token.encode()
        )

    def _login_mac(self, expiry: int, login: str) -> str:
        message = f"login:{self.token}:{expiry}:{login}".encode()
        return hmac.new(self.secret, message, hashlib.sha256).hexdigest()

    def login_cookie(self, lifetime: int = LOGIN_SECONDS) -> str:
        """The login cookie's value once the token was given: its expiry, `lifetime` seconds
        from now, a random name for this login (so that logging out ends this one only), and
        an HMAC of both (and of the token) under this dashboard's secret."""
        expiry = int(time.time()) + lifetime
        login = secrets.token_hex(8)
        return f"{expiry}.{login}.{self._login_mac(expiry, login)}"

    def _login_of(self, candidate: str | None) -> tuple[str, int] | None:
        """(its login, its expiry) for a login cookie this dashboard made, not yet expired."""
        parts = (candidate or "").split(".")
        if len(parts) != 3:
            return None
        expiry, login, mac = parts
        if not expiry.isascii() or not expiry.isdigit() or len(expiry) > 12:
            return None
        if int(expiry) <= time.time() or not login.isascii() or not login.isalnum():
            return None
        expected = self._login_mac(int(expiry), login).encode()
        if not hmac.compare_digest(mac.encode("ascii", "replace"), expected):
            return None
        return login, int(expiry)

    def login_ok(self, candidate: str | None) -> bool:
        """Whether `candidate` is a login cookie this dashboard made, not expired nor logged
        out of."""
        found = self._login_of(candidate)
        return found is not None and found[0] not in self._logged_out

    def log_out(self, cookie: str | None) -> None:
        """Ends the login of `cookie` here: a copy of it, sent again, is refused."""
        now = time.time()
        self._logged_out = {login: e for login, e in self._logged_out.items() if e > now}
        found = self._login_of(cookie)
        if found is not None:
            self._logged_out[found[0]] = found[1]

    def authorized(self, scope: Scope, jar: dict[str, str]) -> bool:
        if self.token is None:
            return True
        bearer = bearer_of(scope)
        if bearer is not None:
            return self.token_ok(bearer)
        return self.login_ok(jar.get(TOKEN_COOKIE))


def bearer_of(scope: Scope) -> str | None:
    """The token an ``Authorization: Bearer`` header gives, if any."""
    given = header(scope, b"authorization")
    if given and given.lower().startswith("bearer "):
        return given[7:].strip()
    return None


def _clicked_link(scope: Scope) -> bool:
    """A top-level page load the user started (a link clicked, an address typed): a page
    cannot make one without the user, so at most one read per click."""
    return (
        scope["method"] == "GET"
        and header(scope, b"sec-fetch-mode") == "navigate"
        and header(scope, b"sec-fetch-dest") == "document"
        and header(scope, b"sec-fetch-user") == "?1"
    )


#: Sent with every response: no page may be framed, by another site or by another port of
#: 127.0.0.1 (same-site, so SameSite cookies go along), so a click cannot be stolen; the pages
#: load only their own script and style (static/), never inline ones.
SECURITY_HEADERS = [
    (b"x-frame-options", b"DENY"),
    (
        b"content-security-policy",
        b"default-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'self';"
        b" object-src 'none'",
    ),
    (b"x-content-type-options", b"nosniff"),
]


class HeadersMiddleware:
    """Pure ASGI: adds SECURITY_HEADERS to every HTTP response (the outermost middleware, so
    to the guard's own 401s and the Host check's 400s too)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = MutableHeaders(scope=message)
                for name, value in SECURITY_HEADERS:
                    headers[name.decode()] = value.decode()
            await send(message)

        await self.app(scope, receive, send_with_headers)


class GuardMiddleware:
    """Pure ASGI: every HTTP request passes the guard before reaching the app."""

    def __init__(self, app: ASGIApp, guard: Guard) -> None:
        self.app = app
        self.guard = guard

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        if self.guard.foreign(scope):
            await self._plain(send, 403, FOREIGN_REFUSED, [])
            return
        jar = cookies(scope)
        session = jar.get(SESSION_COOKIE)
        new_session = None
        if not session or len(session) != 32:
            session = new_session = secrets.token_hex(16)
        scope.setdefault("state", {})["session"] = session
        extra: list[str] = []
        if new_session:
            extra.append(cookie_header(scope, SESSION_COOKIE, new_session))

        if self.guard.token is not None:
            login = scope["path"] == LOGIN_PATH and scope["method"] == "POST"
            query = dict(parse_qsl(scope.get("query_string", b"").decode("latin-1")))
            by_query = "token" in query and scope["method"] == "GET"
            bearer = bearer_of(scope)
            client = scope.get("client") or ("", 0)
            address = str(client[0])
            if login or by_query or bearer is not None:
                wait = self.guard.limit.wait(address)
                if wait > 0:
                    await self._plain(send, 429, TOO_MANY, extra, retry_after=wait)
                    return
            if login:
                await self._login(scope, receive, send, extra, address)
                return
            if scope["path"] == LOGOUT_PATH and scope["method"] == "POST":
                await self._logout(scope, receive, send, jar, extra)
                return
            if by_query:
                if self._token_from(address, query["token"]):
                    rest = urlencode({k: v for k, v in query.items() if k != "token"})
                    location = local_location(scope["path"] + (f"?{rest}" if rest else ""))
                    extra.append(self._login_cookie(scope))
                    await self._plain(send, 303, "", extra, location=location)
                else:
                    await self._plain(send, 401, login_page("wrong token"), extra)
                return
            if bearer is not None and not self._token_from(address, bearer):
                await self._plain(send, 401, login_page(None), extra)
                return
            if not self.guard.authorized(scope, jar):
                await self._plain(send, 401, login_page(None), extra)
                return

        async def send_with_cookies(message: Message) -> None:
            if message["type"] == "http.response.start" and extra:
                headers = MutableHeaders(scope=message)
                for value in extra:
                    headers.append("set-cookie", value)
            await send(message)

        await self.app(scope, receive, send_with_cookies)

    def _token_from(self, address: str, candidate: str | None) -> bool:
        """Whether `candidate` is the token, counted against `address` if not."""
        if self.guard.token_ok(candidate):
            self.guard.limit.succeeded(address)
            return True
        self.guard.limit.failed(address)
        return False

    def _login_cookie(self, scope: Scope) -> str:
        value = self.guard.login_cookie()
        return cookie_header(scope, TOKEN_COOKIE, value, max_age=LOGIN_SECONDS)

    async def _login(
        self, scope: Scope, receive: Receive, send: Send, extra: list[str], address: str
    ) -> None:
        form = await read_form(receive)
        if form is None or not self._token_from(address, form.get("token")):
            await self._plain(send, 401, login_page("wrong token"), extra)
            return
        extra.append(self._login_cookie(scope))
        target = local_location(form.get("next", "/"))
        await self._plain(send, 303, "", extra, location=target)

    async def _logout(
        self, scope: Scope, receive: Receive, send: Send, jar: dict[str, str], extra: list[str]
    ) -> None:
        form = await read_form(receive)
        if form is None or not self.guard.csrf_ok(scope, form):
            await self._plain(send, 403, "refused: missing or wrong CSRF token", extra)
            return
        self.guard.log_out(jar.get(TOKEN_COOKIE))
        cleared = [
            cookie_header(scope, TOKEN_COOKIE, "", max_age=0),
            cookie_header(scope, SESSION_COOKIE, secrets.token_hex(16)),
        ]
        await self._plain(send, 303, "", cleared, location="/")

    async def _plain(
        self,
        send: Send,
        status: int,
        body: str,
        extra: list[str],
        location: str | None = None,
        retry_after: float | None = None,
    ) -> None:
        headers: list[tuple[bytes, bytes]] = [
            (b"content-type", b"text/html; charset=utf-8"),
            (b"cache-control", b"no-store"),
        ]
        if status == 401:
            headers.append((b"www-authenticate", b'Bearer realm="crawlq"'))
        if retry_after is not None:
            headers.append((b"retry-after", str(max(1, math.ceil(retry_after))).encode()))
        if location is not None:
            headers.append((b"location", location.encode()))
        headers += [(b"set-cookie", value.encode("latin-1")) for value in extra]
        data = body.encode()
        headers.append((b"content-length", str(len(data)).encode()))
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": data})


FOREIGN_REFUSED = (
    "refused: another web page sent this request (Sec-Fetch-Site or Origin): open the"
    " dashboard from its own address"
)
TOO_MANY = "too many wrong tokens from this address: wait and try again"


async def read_form(receive: Receive) -> dict[str, str] | None:
    """An urlencoded form body, or None if it is larger than MAX_FORM_BYTES."""
    body = b""
    more = True
    while more:
        message: dict[str, Any] = dict(await receive())
        if message["type"] != "http.request":
            return None
        body += message.get("body", b"")
        more = bool(message.get("more_body"))
        if len(body) > MAX_FORM_BYTES:
            return None
    return dict(parse_qsl(body.decode("utf-8", "replace"), keep_blank_values=True))


def login_page(error: str | None) -> str:
    note = f'<p class="error">{html.escape(error)}</p>' if error else ""
    return (
        "<!doctype html><html><head><meta charset='utf-8'><title>crawlq: token needed</title>"
        "</head><body><h1>crawlq dashboard</h1><p>This dashboard needs its access token.</p>"
        f"{note}<form method='post' action='{LOGIN_PATH}'>"
        "<input type='password' name='token' autocomplete='current-password' "
        "aria-label='token'> <button type='submit'>Open</button></form></body></html>"
    )
