"""robots.txt: fetched once per origin and cached (protego); decides what may be fetched.

As RFC 9309 says: a 4xx robots.txt allows everything, as does one behind a redirect loop or
too many redirects; one larger than MAX_ROBOTS_BYTES is parsed that far. A 5xx or an
unreachable one means the site cannot be crawled for now: its pages fail with a transient
error that says until when (`FetchError.until`, when robots.txt is asked again), and the
crawler pauses the site in the queue till then, so each retry of a page meets a fresh answer
and no worker waits.

A hostile robots.txt must not stall the worker: 512 KiB of rules take protego 0.1 s to parse
and, with tens of thousands of wildcard rules, 15 ms or more to match one URL. A large file
is parsed in a thread; the rules of one with over MAX_CHEAP_PATTERNS wildcard rules are
matched in a thread, and only when a page of the site is fetched (`disallows`, asked for
every link a page holds, does not judge them).
"""

from __future__ import annotations

import asyncio
import functools
import re
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from urllib.parse import urlsplit

from protego import Protego

from .errors import TRANSIENT, FetchError, Reason, Throttled
from .response import Response

RobotsFetch = Callable[[str], Awaitable[Response]]

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
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._fetch = fetch
        self._agent = user_agent.split("/", 1)[0]
        self._ttl = ttl
        self._retry = retry  # how long an unreachable robots.txt stands before it is asked again
        self._clock = clock
        self._rules: OrderedDict[str, Rules] = OrderedDict()
        self._size = 0  # of the rules kept
        self._pending: dict[str, asyncio.Future[Rules]] = {}

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

    async def _load_for_all(self, key: str, url: str) -> Rules:
        """Loads `key`'s rules for this task and every one that asks meanwhile. If this task
        is cancelled, so is the request (its lease or send slot may be gone): the others are
        woken, and the first of them fetches robots.txt again, on its own slot."""
        future: asyncio.Future[Rules] = asyncio.get_running_loop().create_future()
        self._pending[key] = future
        try:
            rules = await self._load(url)
        except asyncio.CancelledError:
            future.cancel()
            raise
        except BaseException as exc:
            future.set_exception(exc)
            future.exception()  # retrieved here, so a future nobody awaits stays quiet
            raise
        finally:
            del self._pending[key]
        replaced = self._rules.pop(key, None)
        self._size += rules.size - (replaced.size if replaced is not None else 0)
        self._rules[key] = rules
        while len(self._rules) > MAX_ORIGINS or self._size > MAX_RULES_BYTES:
            self._size -= self._rules.popitem(last=False)[1].size
        future.set_result(rules)
        return rules

    async def _load(self, url: str) -> Rules:
        now = self._clock()
        try:
            response = await self._fetch(url)
        except Throttled:
            raise  # not sent (its pacing put it back): robots.txt is not unavailable
        except FetchError as exc:
            if exc.reason is Reason.TOO_LARGE or exc.reason in UNAVAILABLE:
                # Unavailable (RFC 9309), or inflated past the cap (a bomb): no rules.
                return Rules(None, None, now + self._ttl)
            # The site itself is unreachable: its pages fail for the same reason.
            detail = f"robots.txt unreachable: {exc.detail or exc.reason.value}"
            if exc.reason is Reason.BLOCKED:
                detail = exc.detail  # the site's address is refused, not its robots.txt
            return Rules(None, detail, now + self._retry, exc.reason)
        if response.status >= 500 or response.status == 429:
            return Rules(None, f"robots.txt answered {response.status}", now + self._retry)
        if response.status >= 400 or response.is_redirect:
            return Rules(None, None, now + self._ttl)
        text = response.body[:MAX_ROBOTS_BYTES].decode("utf-8", "replace")
        if len(text) > INLINE_ROBOTS_CHARS:
            parser, costly = await asyncio.to_thread(_parse, text)
        else:
            parser, costly = _parse(text)
        size = RULES_OVERHEAD + PARSED_BYTES_PER_BYTE * len(text)
        delay = self._delay(parser)
        return Rules(parser, None, now + self._ttl, delay=delay, size=size, costly=costly)

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
