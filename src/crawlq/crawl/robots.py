"""robots.txt: fetched once per origin and cached (protego); decides what may be fetched.

As RFC 9309 says: a 4xx robots.txt allows everything, as does one behind a redirect loop or
too many redirects; one larger than MAX_ROBOTS_BYTES is parsed that far. A 5xx or an
unreachable one means the site cannot be crawled for now: its pages fail with a transient
error that says until when (`FetchError.until`, when robots.txt is asked again), and the
crawler pauses the site in the queue till then, so each retry of a page meets a fresh answer
and no worker waits.

Every worker of a crawl, on every machine, shares what it made of an origin's robots.txt
through the backend (`RobotsStore`): the first to meet the origin fetches it and keeps the
answer there (its text, or that everything is allowed, or that the site answered 5xx and
until when), and the others read it instead of fetching it again. Only what the server
answered is shared, and of that only what does not hang on the worker itself: a failure to
get an answer (no connection, TLS, DNS), a 401, 403 or 407 (its credentials, its address),
a 5xx through its proxy, a body cut short by its size cap stay with it. Two processes
meeting a new origin at the same moment may both fetch it; after that, nobody does until it
expires. The store is a help, never a need: when the backend fails to read or keep an
answer, one warning says so, the store is left alone for STORE_PAUSE seconds, and
robots.txt is fetched as without it.

A hostile robots.txt must not stall the worker: 512 KiB of rules take protego 0.1 s to parse
and, with tens of thousands of wildcard rules, 15 ms or more to match one URL. A large file
is parsed in a thread; the rules of one with over MAX_CHEAP_PATTERNS wildcard rules are
matched in a thread, and only when a page of the site is fetched (`disallows`, asked for
every link a page holds, does not judge them).
"""

from __future__ import annotations

import asyncio
import functools
import json
import re
import time
import zlib
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Protocol
from urllib.parse import urlsplit

from protego import Protego

from .. import checks
from ..backends.base import MAX_ROBOTS_ANSWER
from ..observe.logs import logger
from .errors import TRANSIENT, FetchError, Reason, Throttled
from .response import Response

RobotsFetch = Callable[[str], Awaitable[Response]]

log = logger("crawlq.crawl")

MAX_ORIGINS = 10_000
#: And at most about this many bytes of parsed rules: protego keeps about 6 bytes for each
#: byte of robots.txt, so 10,000 of 512 KiB would be 30 GB. The least recently used go.
MAX_RULES_BYTES = 256 * 1024 * 1024
PARSED_BYTES_PER_BYTE = 6
RULES_OVERHEAD = 1024
MAX_ROBOTS_BYTES = 512 * 1024  # RFC 9309: crawlers parse at least 500 KiB
#: A robots.txt larger than this is parsed in a thread (about 15 ms of protego on the loop).
INLINE_ROBOTS_CHARS = 64 * 1024
#: Rules with a wildcard (* or $) protego matches one by one; more than this many and a match
#: could take milliseconds (`Rules.costly`).
MAX_CHEAP_PATTERNS = 1_000
#: Rules of any kind, more than this many and a match could take a millisecond as well: a
#: plain rule costs protego about a fifth of a wildcard one.
MAX_CHEAP_RULES = 5 * MAX_CHEAP_PATTERNS
#: An http(s) URL whose host[:port] is already lower case (no IPv6 literal), with no userinfo
#: and nothing urlsplit would strip or read otherwise: as canonical links and most pages are.
_PLAIN_ORIGIN = re.compile(r"(https?://[a-z0-9.:-]+)(?=[/?#]|\Z)")
#: Lines of robots.txt that are no rules, wildcard or not (protego drops a user agent's *).
_NO_RULE = re.compile(r"user[\s-]*agent|site-?maps?\b", re.IGNORECASE)
#: Redirects RFC 9309 lets a crawler take as "robots.txt unavailable" (allowing everything).
UNAVAILABLE = frozenset({Reason.REDIRECT_LOOP, Reason.TOO_MANY_REDIRECTS})
#: An answer another worker kept is recalled before pacing only with at least this long
#: left: `check` must find it standing right after, or it would fetch robots.txt on no send
#: slot. Once paced, one is taken with half the unreachable pause left (at most this): a
#: page retried as an unreachable robots.txt expires must meet a fresh answer.
RECALL_MARGIN = 1.0
#: After the backend failed to read or keep an answer, it is not asked for this long.
STORE_PAUSE = 30.0
#: Answers that hang on the worker that asked (its credentials, its address, its proxy's).
PERSONAL_STATUSES = frozenset({401, 403, 407})
#: At most this many bytes of a kept answer are inflated (a robots.txt is cut at
#: MAX_ROBOTS_BYTES characters, each up to 4 bytes, plus JSON escaping).
MAX_ANSWER_BYTES = 8 * MAX_ROBOTS_BYTES
#: A site paused until its unreachable robots.txt expires is claimed again a little after,
#: so the page that comes back finds it expired (the pause counts by the wall clock).
UNTIL_SLACK = 0.01


@dataclass(frozen=True, slots=True)
class Rules:
    parser: Protego | None  # None: everything allowed
    unavailable: str | None
    expires: float  # by the cache's clock
    failure: Reason = Reason.ROBOTS_UNAVAILABLE  # what a page of an unavailable site fails with
    delay: float | None = None  # Crawl-delay or Request-rate, seconds per request
    size: int = RULES_OVERHEAD  # about what it takes in memory
    costly: bool = False  # matched in a thread, and only for a page about to be fetched


class RobotsStore(Protocol):
    """Where the workers of a crawl keep robots.txt answers for each other: the backend."""

    async def robots_answer(self, origin: str) -> tuple[bytes, float] | None: ...

    async def keep_robots_answer(self, origin: str, answer: bytes, seconds: float) -> None: ...


@functools.lru_cache(maxsize=4096)
def origin(url: str) -> str:
    """scheme://host[:port] of `url`, lower-cased, without its userinfo: the rules of a
    host, whoever asks (remembered: a page asks it several times)."""
    plain = _PLAIN_ORIGIN.match(url)
    if plain is not None:
        return plain.group(1)  # what urlsplit gives such a URL, in a fifth of its time
    parts = urlsplit(url)
    return f"{parts.scheme.lower()}://{parts.netloc.rpartition('@')[2].lower()}"


def robots_url(url: str) -> str:
    """The robots.txt of `url`'s host, asked with `url`'s credentials as they are written
    (a password is case-sensitive): a site behind a login serves its rules to its users."""
    parts = urlsplit(url)
    return f"{parts.scheme.lower()}://{parts.netloc}/robots.txt"


class RobotsCache:
    def __init__(
        self,
        fetch: RobotsFetch,
        user_agent: str,
        *,
        ttl: float,
        retry: float = 60.0,
        kept_bytes: int = MAX_ROBOTS_BYTES,
        proxied: bool = False,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._fetch = fetch
        self.kept_bytes = kept_bytes  # of a robots.txt, by `fetch`: what it cuts it to
        self._proxied = proxied  # a 5xx may be the proxy's own
        self._margin = min(RECALL_MARGIN, retry / 2)
        self._store_paused_until = 0.0  # by the cache's clock
        self._agent = user_agent.split("/", 1)[0]
        self._ttl = ttl
        self._retry = retry  # how long an unreachable robots.txt stands before it is asked again
        self._clock = clock
        self._rules: OrderedDict[str, Rules] = OrderedDict()
        self._size = 0  # of the rules kept
        self._pending: dict[str, asyncio.Future[Rules]] = {}
        #: Shared with the crawl's other workers through it, once a worker's politeness
        #: (which has the backend) has used this cache.
        self.store: RobotsStore | None = None

    async def rules(self, url: str) -> Rules:
        key = origin(url)
        while True:
            cached = self._rules.get(key)
            if cached is not None and cached.expires > self._clock():
                self._rules.move_to_end(key)
                return cached
            pending = self._pending.get(key)
            if pending is None:
                return await self._load_for_all(key, robots_url(url))
            # Unlike awaiting it, waiting leaves `pending` alone when this task is cancelled.
            await asyncio.wait([pending])
            if not pending.cancelled():
                return pending.result()
            # The task fetching it was cancelled: one of those waiting fetches it instead.

    async def recall(self, url: str) -> bool:
        """Whether `url`'s rules are at hand, or kept by another worker (then they are at
        hand from now on): checking it sends no robots.txt request."""
        if self.known(url):
            return True
        key = origin(url)
        if self.store is None or key in self._pending:
            return False
        rules = await self._recalled(key, RECALL_MARGIN)
        if rules is None or rules.expires < self._clock() + RECALL_MARGIN:
            return False  # parsed in a thread meanwhile: the margin must stand after it
        self._keep(key, rules)
        return True

    async def _load_for_all(self, key: str, url: str) -> Rules:
        """Loads `key`'s rules for this task and every one that asks meanwhile: another
        worker's answer, else robots.txt itself. If this task is cancelled, so is the
        request (its lease or send slot may be gone): the others are woken, and the first
        of them fetches robots.txt again, on its own slot."""
        future: asyncio.Future[Rules] = asyncio.get_running_loop().create_future()
        self._pending[key] = future
        answer = None
        try:
            rules = await self._recalled(key, self._margin)
            if rules is None:
                rules, answer = await self._load(url)
        except asyncio.CancelledError:
            future.cancel()
            raise
        except BaseException as exc:
            future.set_exception(exc)
            future.exception()  # retrieved here, so a future nobody awaits stays quiet
            raise
        finally:
            del self._pending[key]
        self._keep(key, rules)
        future.set_result(rules)
        if answer is not None:  # before this task's own request: a page it finds may ask
            await self._share(key, rules, answer)
        return rules

    def _keep(self, key: str, rules: Rules) -> None:
        replaced = self._rules.pop(key, None)
        self._size += rules.size - (replaced.size if replaced is not None else 0)
        self._rules[key] = rules
        while len(self._rules) > MAX_ORIGINS or self._size > MAX_RULES_BYTES:
            self._size -= self._rules.popitem(last=False)[1].size

    async def _load(self, url: str) -> tuple[Rules, dict[str, Any] | None]:
        """The rules robots.txt gives, and the answer to keep for the other workers (None:
        no answer of the server's, or one cut short by this worker's own size cap)."""
        now = self._clock()
        allowed = {"allowed": True}
        try:
            response = await self._fetch(url)
        except Throttled:
            raise  # not sent (its pacing put it back): robots.txt is not unavailable
        except FetchError as exc:
            if exc.reason is Reason.TOO_LARGE or exc.reason in UNAVAILABLE:
                # Unavailable (RFC 9309), or inflated past the cap (a bomb): no rules.
                return Rules(None, None, now + self._ttl), None
            # The site itself is unreachable: its pages fail for the same reason.
            detail = f"robots.txt unreachable: {exc.detail or exc.reason.value}"
            if exc.reason is Reason.BLOCKED:
                detail = exc.detail  # the site's address is refused, not its robots.txt
            return Rules(None, detail, now + self._retry, exc.reason), None
        if response.status >= 500 or response.status == 429:
            detail = f"robots.txt answered {response.status}"
            unavailable = None if self._proxied else {"unavailable": detail}
            return Rules(None, detail, now + self._retry), unavailable
        if response.status >= 400 or response.is_redirect:
            personal = response.status in PERSONAL_STATUSES
            return Rules(None, None, now + self._ttl), None if personal else allowed
        text = response.body[:MAX_ROBOTS_BYTES].decode("utf-8", "replace")
        cut_short = len(response.raw) >= self.kept_bytes < MAX_ROBOTS_BYTES
        answer = None if cut_short else {"text": text}
        return await self._parsed(text, now + self._ttl), answer

    async def _parsed(self, text: str, expires: float) -> Rules:
        if len(text) > INLINE_ROBOTS_CHARS:
            parser, costly = await asyncio.to_thread(_parse, text)
        else:
            parser, costly = _parse(text)
        size = RULES_OVERHEAD + PARSED_BYTES_PER_BYTE * len(text)
        delay = self._delay(parser)
        return Rules(parser, None, expires, delay=delay, size=size, costly=costly)

    async def _share(self, key: str, rules: Rules, answer: dict[str, Any]) -> None:
        """Keeps `answer` for the other workers while `rules` stand (not one too large for
        the backend: each worker then fetches that robots.txt itself)."""
        seconds = min(rules.expires - self._clock(), checks.MAX_SECONDS)
        store = self._usable_store()
        if store is None or not seconds > 0:
            return
        packed = zlib.compress(json.dumps(answer).encode())
        if len(packed) > MAX_ROBOTS_ANSWER:
            return
        try:
            await store.keep_robots_answer(key, packed, seconds)
        except Exception as exc:
            self._store_failed("keep", key, exc)
        else:
            self._store_ok()

    def _usable_store(self) -> RobotsStore | None:
        return None if self._clock() < self._store_paused_until else self.store

    def _store_failed(self, doing: str, key: str, exc: Exception) -> None:
        """One warning, then the store is left alone for STORE_PAUSE: a backend that cannot
        be reached takes its reconnect patience to say so, for each call."""
        if not self._store_paused_until:
            log.warning(
                "could not %s the robots.txt answer of %s in the backend (%s): robots.txt "
                "is fetched without it for %g s",
                doing,
                key,
                exc,
                STORE_PAUSE,
            )
        self._store_paused_until = self._clock() + STORE_PAUSE

    def _store_ok(self) -> None:
        if self._store_paused_until:
            log.info("robots.txt answers are shared through the backend again")
        self._store_paused_until = 0.0

    async def _recalled(self, key: str, margin: float) -> Rules | None:
        """The rules of the answer another worker kept for `key`, if one stands `margin`
        seconds more (one this crawlq cannot read counts as none: robots.txt is fetched
        again)."""
        store = self._usable_store()
        if store is None:
            return None
        try:
            kept = await store.robots_answer(key)
        except Exception as exc:
            self._store_failed("read", key, exc)
            return None
        self._store_ok()
        if kept is None or kept[1] < margin:
            return None
        packed, seconds = kept
        expires = self._clock() + seconds
        try:
            inflater = zlib.decompressobj()
            answer = json.loads(inflater.decompress(packed, MAX_ANSWER_BYTES))
            if inflater.unconsumed_tail or not isinstance(answer, dict):
                return None
            if answer.get("allowed") is True:
                return Rules(None, None, expires)
            if isinstance(text := answer.get("text"), str):
                return await self._parsed(text[:MAX_ROBOTS_BYTES], expires)
            if isinstance(detail := answer.get("unavailable"), str):
                return Rules(None, detail, expires)
        except (zlib.error, ValueError, RecursionError):  # json's errors are ValueErrors
            return None
        return None

    def _delay(self, parser: Protego) -> float | None:
        delay = parser.crawl_delay(self._agent)
        rate = parser.request_rate(self._agent)
        if rate is not None and rate.requests:
            per_request = rate.seconds / rate.requests
            delay = per_request if delay is None else max(delay, per_request)
        return None if delay is None else float(delay)

    def known(self, url: str) -> bool:
        """Whether `url`'s rules are at hand: checking it sends no robots.txt request."""
        return self._at_hand(url) is not None

    def _at_hand(self, url: str) -> Rules | None:
        cached = self._rules.get(origin(url))
        return cached if cached is not None and cached.expires > self._clock() else None

    async def check(self, url: str) -> None:
        """Raises FetchError unless robots.txt lets this crawler fetch `url`."""
        rules = await self.rules(url)
        if rules.unavailable is not None:
            until = None
            if rules.failure in TRANSIENT:  # not a refused address: that stays refused
                until = time.time() + max(0.0, rules.expires - self._clock()) + UNTIL_SLACK
            raise FetchError(rules.failure, url, rules.unavailable, until=until)
        if rules.costly:
            refused = await asyncio.to_thread(self._refuses, rules, url)
        else:
            refused = self._refuses(rules, url)
        if refused:
            raise refusal(url)

    def disallows(self, url: str) -> bool:
        """Whether the rules at hand refuse `url` (False when none are, or they are costly:
        nothing is fetched before `check`)."""
        rules = self._at_hand(url)
        return rules is not None and not rules.costly and self._refuses(rules, url)

    def _refuses(self, rules: Rules, url: str) -> bool:
        return rules.parser is not None and not rules.parser.can_fetch(url, self._agent)

    def delay(self, url: str) -> float | None:
        """The Crawl-delay (or Request-rate) robots.txt asks of this origin, once known."""
        rules = self._rules.get(origin(url))
        return None if rules is None else rules.delay


def _parse(text: str) -> tuple[Protego, bool]:
    """The rules of `text`, and whether they are costly to match (`_costly`)."""
    return Protego.parse(text), _costly(text)


def _costly(text: str) -> bool:
    """Whether matching a URL against the rules of `text` could take a millisecond or more:
    over MAX_CHEAP_PATTERNS of them have a wildcard, each matched one by one, or over
    MAX_CHEAP_RULES are rules at all (a URL that one plain rule matches, as `Allow: /` matches
    every URL, is matched against each rule in turn). Lines and comments are read as protego
    reads them (str.splitlines ends a line at a lone CR, a form feed or U+2028 too), and any
    line but a user agent's or a sitemap's counts, so that no spelling protego takes for a
    rule (``Dissallow: /*x``, ``Disallow /*x``, a leading no-break space) goes uncounted."""
    patterns = rules = 0
    for line in text.splitlines():
        line = line.partition("#")[0].strip()
        if not line or _NO_RULE.match(line):
            continue
        rules += 1
        if "*" in line or "$" in line:
            patterns += 1
        if patterns > MAX_CHEAP_PATTERNS or rules > MAX_CHEAP_RULES:
            return True
    return False


def refusal(url: str) -> FetchError:
    return FetchError(Reason.ROBOTS_DISALLOWED, url, "disallowed by robots.txt")
