"""Politeness from the server's side, pushed into the queue so no worker ever waits:

- robots.txt Crawl-delay raises the group's interval (a floor under its limit rule's);
- 429 and 503 with Retry-After block the group until then;
- repeated timeouts, refusals and 5xx back the group off exponentially (a block too).

Blocks carry a reason that `crawlq stats` and `group_stats` show. A worker also remembers
the blocks it set, so tasks it already claimed for that group do not send requests early.

The queue spaces a group's claims by its interval, but a claim is not the request: the time
from claim to the request's first byte varies by a few milliseconds (tens on a loaded
machine), and the robots.txt request a host's first page sends is a request too. So each
request is paced as well, right before it is sent: it reserves its time in the backend, at
least the interval after the previous request any worker on any machine reserved for the
group and after this worker's own last request to the host (robots.txt included), and waits
for it (a few milliseconds as a rule; a wait longer than `MAX_PACING_WAIT` puts the page back
in the queue as Throttled instead).

Waking up on time is not sending on time: between the reserved time and the write the worker
can be late by tens of milliseconds (a busy event loop, a new TCP connection, a loaded
machine), while the next request, reserved one gap later, may be on time. So the request
confirms its slot right before its bytes are written (`Slot.confirm`, called by the
fetcher's request once the connection is in hand). Later than `SEND_TOLERANCE`, it does not
go on the old time: if that is still the group's latest reservation, the backend moves it to
now and the request goes at once (nobody counts from it yet); otherwise it takes a fresh slot
and waits again (Backend.reserve_send_slot), a few times at most (`MAX_SLOT_TRIES`). The
slot's time is read by the worker's clock where it agrees with the backend's (one machine,
or NTP), else bounded by when the reservation was asked for and answered.
"""

from __future__ import annotations

import asyncio
import datetime
import email.utils
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from ..backends import Backend
from ..errors import BackendError, InvalidElement
from ..grouping import url_host
from ..limits import RuleIndex
from ..observe.logs import logger
from .errors import HOST_TROUBLE, FetchError, Reason, Throttled
from .fetcher import Fetcher, forget_before
from .response import Response

log = logger("crawlq.crawl")

#: A 429/503 without a usable Retry-After pauses its group this long.
DEFAULT_RETRY_AFTER = 30.0
#: Nobody is blocked longer than this by one answer, whatever it says.
MAX_RETRY_AFTER = 24 * 3600.0
#: A request that would wait longer than this for its group's interval is put back instead.
MAX_PACING_WAIT = 2.0
#: Requests are paced this much further apart (a fraction of the interval, at most
#: MAX_PACING_MARGIN): the time from sending to the server's reading varies by milliseconds.
PACING_MARGIN = 0.01
MAX_PACING_MARGIN = 0.005
#: A request at most this much later than its slot (and than half the margin, the other half
#: being for the write itself to reach the server) goes on it; later, it takes the slot
#: over at the current time or waits for a new one (`Slot`).
SEND_TOLERANCE = 0.002
#: A late request tries this many times to take its slot over or get a new one in time,
#: and is put back (Throttled) if it is still late.
MAX_SLOT_TRIES = 5
#: A slot taken over moves at least this far ahead of now (`Slot.confirm`).
MIN_LEAD = 0.002
#: A wait for a slot yields to the event loop, instead of sleeping, for its last this many
#: seconds (`Politeness.sleep_until`): the loop's timers are a millisecond coarse.
SPIN_FINISH = 0.001
#: How long the limit rules read from the backend are trusted before they are read again.
LIMITS_TTL = 5.0
#: Seconds between prunings of what a worker keeps by host and group (`Politeness.tidy`).
TIDY_EVERY = 60.0
#: A group's failures in a row are forgotten after this long without another, once its
#: backoff has ended: a host that failed an hour ago has not failed "in a row" since.
FAILURE_MEMORY = 3600.0


@dataclass(frozen=True, kw_only=True, slots=True)
class Backoff:
    """After `after` failures in a row from a group, block it base * factor**k (k counts the
    failures beyond `after`), capped."""

    after: int = 3
    base: float = 5.0
    factor: float = 2.0
    cap: float = 600.0

    def pause(self, failures: int) -> float | None:
        if failures < self.after:
            return None
        return min(self.cap, self.base * self.factor ** (failures - self.after))


@dataclass(kw_only=True, slots=True)
class Slot:
    """One request's send time, reserved in the backend (`at`, by its clock) and due `due` by
    ours; `SendSlot` for the fetcher."""

    politeness: Politeness
    group: str
    url: str
    gap: float
    tolerance: float
    fetcher: Fetcher | None = None
    at: float = 0.0
    due: float = 0.0
    answer: float = 0.0  # seconds the last reservation took, there and back
    sent: bool = False  # confirmed once: another request on it (a redirect, a retry) needs its own

    async def reserve(
        self, earliest: float, replacing: float | None = None, max_wait: float | None = None
    ) -> tuple[float, bool]:
        """Reserves (or, with `replacing`, takes over) a time; returns the wait for it and
        whether `replacing` was kept.

        `due` is `at` read by our clock: the backend's time `at` if our clocks agree (it then
        lies between when we asked plus the wait and when the answer came plus the wait),
        else the nearer of those two bounds."""
        clock = self.politeness.clock
        asked = clock()
        self.at, wait, kept = await self.politeness.backend.reserve_send_slot(
            self.group, self.gap, earliest, replacing=replacing, max_wait=max_wait
        )
        answered = clock()
        self.answer = answered - asked
        self.due = min(max(self.at, asked + wait), answered + wait)
        return wait, kept

    async def confirm(self) -> None:
        """Returns when the request may be written: on its slot, unless it is more than
        `tolerance` late for it; then on its slot moved to now if nobody has reserved after
        it, else on a fresh one, after waiting for it. Throttled (the page is put back) if
        it is still late after MAX_SLOT_TRIES such tries: never sent late.

        A slot taken over moves a lead ahead of now (the time the backend took to answer the
        last reservation, at least MIN_LEAD, at most a quarter of the gap: the answer comes
        back at most a round trip after the backend's now, and should this one take longer,
        the next try finds the request late again): the request goes as soon as
        the answer is in, before its new time (it is past its old one, so the request before
        it is a gap behind), and the next request counts from the new time, which the write
        will not be later than unless the worker falls behind again."""
        politeness = self.politeness
        if self.sent:  # a second request on one slot: it reserves its own
            self.sent = False
            await self.reserve(politeness.earliest(self))
            await politeness.sleep_until(self.due)
        for _ in range(MAX_SLOT_TRIES):
            late = politeness.clock() - self.due
            if late <= self.tolerance:
                break
            politeness.late_sends += 1
            politeness.latest_send = max(politeness.latest_send, late)
            lead = min(self.gap / 4, max(MIN_LEAD, self.answer))
            _, kept = await self.reserve(lead, replacing=self.at)
            if not kept:
                await politeness.sleep_until(self.due)
        else:
            late = politeness.clock() - self.due
            if late > self.tolerance:
                politeness.put_back += 1
                detail = (
                    f"group {self.group}: still {late * 1000:.1f} ms late for its slot after"
                    f" {MAX_SLOT_TRIES} tries (a loaded worker)"
                )
                raise Throttled(self.url, politeness.clock() + self.gap, detail)
        politeness.check_open(self.group, self.url)
        self.sent = True
        politeness.sent_at(self.group, self.due)

    def answered(self, status: int, retry_after: str | None) -> None:
        self.politeness.pause_early(self.group, status, retry_after)


@dataclass(kw_only=True, slots=True)
class Unpaced:
    """The `SendSlot` of a request to a group without an interval: nothing to wait for, but
    a pause of its group is checked right before the request is written, and a 429/503
    head pauses it at once."""

    politeness: Politeness
    group: str
    url: str

    async def confirm(self) -> None:
        self.politeness.check_open(self.group, self.url)

    def answered(self, status: int, retry_after: str | None) -> None:
        self.politeness.pause_early(self.group, status, retry_after)


def retry_after(value: str | None, now: float) -> float | None:
    """Retry-After as an epoch time: delay-seconds or an HTTP-date; None if unusable."""
    if not value:
        return None
    value = value.strip()
    if value.isascii() and value.isdigit():  # "²".isdigit() too
        return now + min(float(value), MAX_RETRY_AFTER)
    try:
        moment = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if moment.tzinfo is None:  # asctime and "-0000" dates: HTTP dates are all in GMT
        moment = moment.replace(tzinfo=datetime.UTC)
    return min(moment.timestamp(), now + MAX_RETRY_AFTER)


class Politeness:
    """One per worker and backend; `fetch` is the fetcher with the server's wishes applied."""

    def __init__(
        self,
        backend: Backend,
        *,
        backoff: Backoff | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.backend = backend
        self.backoff = backoff or Backoff()
        self.clock = clock
        self._blocked: dict[str, float] = {}
        self._block_reasons: dict[str, str] = {}
        self._failures: dict[str, tuple[int, float]] = {}  # in a row, and when the last
        self._delays: dict[str, float] = {}  # the Crawl-delays this worker read
        # Any worker's, of the groups asked since the rules were last read: a broad crawl
        # stores one for every host whose robots.txt asks, too many to read them all.
        self._stored_delays: dict[str, float] = {}
        self._asked: dict[str, asyncio.Future[float]] = {}  # to read in the next lookup
        self._lookups: set[asyncio.Future[None]] = set()
        self._in_flight: dict[str, asyncio.Future[float]] = {}  # asked, not answered yet
        self._last_sent: dict[str, float] = {}  # group -> when this worker's last request went
        self.late_sends = 0  # slots taken over or replaced: their request was late for them
        self.latest_send = 0.0  # seconds: the latest a request was for its slot
        self.put_back = 0  # requests still late after MAX_SLOT_TRIES: not sent, put back
        self._limits: RuleIndex | None = None
        self._reading: asyncio.Future[RuleIndex] | None = None
        self._limits_read = 0.0
        self._intervals: dict[str, float] = {}
        self._epoch = backend.epoch
        self._longest_gap = 0.0  # seconds: the longest a slot of this worker kept groups apart
        self._tidied = clock()

    async def interval(self, group: str) -> float:
        """The group's interval: its limit rule, or its Crawl-delay (any worker's, read again
        after the rules, every LIMITS_TTL seconds, or this worker's), whichever is longer. A
        worker meeting a host after another read its robots.txt paces even its own robots.txt
        request by the Crawl-delay."""
        rules = await self._rules()
        interval = self._intervals.get(group)
        if interval is None:
            stored = self._stored_delays.get(group)
            if stored is None:
                stored = await self._stored_delay(group)
                if self._limits is not rules:  # read again meanwhile: the new rules count
                    return await self.interval(group)
            interval = max(rules.resolve(group).interval, stored, self._delays.get(group, 0.0))
            self._intervals[group] = interval
        return interval

    async def _stored_delay(self, group: str) -> float:
        """The group's Crawl-delay as any worker stored it (0 if none), read with those of
        every other group asked for in the same loop turn, in one call."""
        future = self._asked.get(group) or self._in_flight.get(group)
        if future is None:
            if not self._asked:
                asyncio.get_running_loop().call_soon(self._look_up)
            future = self._asked[group] = asyncio.get_running_loop().create_future()
        return await asyncio.shield(future)

    def _look_up(self) -> None:
        asked, self._asked = self._asked, {}
        self._in_flight.update(asked)
        lookup = asyncio.ensure_future(self._read_stored_delays(asked))
        self._lookups.add(lookup)
        lookup.add_done_callback(self._lookups.discard)

    async def _read_stored_delays(self, asked: dict[str, asyncio.Future[float]]) -> None:
        limits = self._limits
        try:
            found = await self.backend.crawl_delays(list(asked))
        except BaseException as exc:
            self._forget_in_flight(asked)
            for future in asked.values():
                if not future.done():
                    future.set_exception(exc)
                    future.exception()  # each asker raises it; none left to log it unread
            if not isinstance(exc, Exception):
                raise
            return
        self._forget_in_flight(asked)
        for group, future in asked.items():
            seconds = found.get(group, 0.0)
            if self._limits is limits:  # else read before the caches were cleared
                self._stored_delays[group] = seconds
            if not future.done():
                future.set_result(seconds)

    def _forget_in_flight(self, asked: dict[str, asyncio.Future[float]]) -> None:
        for group, future in asked.items():
            if self._in_flight.get(group) is future:
                del self._in_flight[group]

    async def _rules(self) -> RuleIndex:
        """The limit rules, read again every LIMITS_TTL seconds, once for all the tasks that
        ask meanwhile (at the start of a crawl, every task asks at once)."""
        if self._limits is not None and time.monotonic() - self._limits_read <= LIMITS_TTL:
            return self._limits
        if self._reading is None:
            self._reading = asyncio.ensure_future(self._read_rules())
        reading = self._reading
        return await asyncio.shield(reading)

    async def _read_rules(self) -> RuleIndex:
        try:
            self._limits = RuleIndex(await self.backend.limits())
            self._limits_read = time.monotonic()
            self._intervals.clear()
            self._stored_delays.clear()
            return self._limits
        finally:
            self._reading = None

    async def pace(self, group: str, url: str, fetcher: Fetcher | None = None) -> Slot | Unpaced:
        """Waits until `group`'s interval has passed since the last request to it that any
        worker reserved (Backend.reserve_send_slot), and since this worker's own last request
        to `url`'s host (robots.txt included); Throttled if that is more than MAX_PACING_WAIT
        away. Returns the slot the request confirms right before it is written (Unpaced: the
        group has no interval)."""
        interval = await self.interval(group)
        if interval <= 0:
            return Unpaced(politeness=self, group=group, url=url)
        margin = min(MAX_PACING_MARGIN, interval * PACING_MARGIN)
        self._longest_gap = max(self._longest_gap, interval + margin)
        slot = Slot(
            politeness=self,
            group=group,
            url=url,
            gap=interval + margin,
            tolerance=min(SEND_TOLERANCE, margin / 2),
            fetcher=fetcher,
        )
        # Not reserved if further away than MAX_PACING_WAIT: the page is put back until then,
        # and a slot it left behind would put back the next try a gap later, forever.
        wait, _ = await slot.reserve(self.earliest(slot), max_wait=MAX_PACING_WAIT)
        if wait > MAX_PACING_WAIT:
            raise Throttled(url, self.clock() + wait, f"group {group} interval {interval:g}s")
        await self.sleep_until(slot.due)
        return slot

    async def sleep_until(self, due: float) -> None:
        """Returns once `due` (by `clock`) has come, and rarely more than a loop turn later.

        Not `sleep(wait)` from the backend's answer: that wakes the answer's trip late. Nor a
        plain sleep to `due`: the event loop's timers wake up to a millisecond late (epoll
        counts whole milliseconds), more than a short interval's tolerance, and two requests
        of a group that are both late at each try leapfrog each other's fresh slots until
        they are put back, again and again. So the last SPIN_FINISH is spent yielding."""
        loop = asyncio.get_running_loop()
        end = loop.time() + due - self.clock()
        if end - SPIN_FINISH > loop.time():
            await asyncio.sleep(end - SPIN_FINISH - loop.time())
        while loop.time() < end:
            await asyncio.sleep(0)

    def earliest(self, slot: Slot) -> float:
        """Seconds from now until the slot's gap has passed since this worker's own last
        request to its group, and to its URL's host."""
        last = self._last_sent.get(slot.group, 0.0)
        if slot.fetcher is not None:
            last = max(last, slot.fetcher.last_sent(url_host(slot.url)) or 0.0)
        return max(0.0, last + slot.gap - self.clock())

    def sent_at(self, group: str, when: float) -> None:
        self._last_sent[group] = max(when, self._last_sent.get(group, 0.0))

    def tidy(self, fetcher: Fetcher) -> None:
        """Every TIDY_EVERY seconds, forgets what a crawl over millions of hosts would
        otherwise keep for every host it saw, not only those it is crawling:
        - send times (this worker's, by group, and the fetcher's, by host) from before the
          longest gap it paced by: `earliest` reads them as it reads none;
        - blocks that ended;
        - failures in a row, FAILURE_MEMORY after the last, unless the group is blocked;
        - Crawl-delays of groups with none of those send times left: the next request to
          one reads its delay again (robots.txt's, or the backend's), before it is paced."""
        now = self.clock()
        if now - self._tidied < TIDY_EVERY:
            return
        self._tidied = now
        horizon = now - self._longest_gap
        forget_before(self._last_sent, horizon)
        fetcher.forget_sent_before(horizon)
        for group in list(self._blocked):
            self.blocked_until(group)  # forgets the block, and its reason, if it ended
        stale = now - FAILURE_MEMORY
        for group in [g for g, (_, last) in self._failures.items() if last < stale]:
            if group not in self._blocked:
                del self._failures[group]
        for group in [group for group in self._delays if group not in self._last_sent]:
            del self._delays[group]

    def blocked_until(self, group: str) -> float | None:
        until = self._blocked.get(group)
        if until is not None and until <= self.clock():
            del self._blocked[group]
            self._block_reasons.pop(group, None)
            return None
        return until

    def check_open(self, group: str, url: str) -> None:
        """Throttled if `group` is paused (this worker heard a 429/503 or backed it off)."""
        until = self.blocked_until(group)
        if until is not None:
            raise Throttled(url, until, f"group {group} is paused")

    def pause_for(self, status: int, retry_after_header: str | None) -> float | None:
        """Until when a response asks its group to pause: a 429, or a 503 with Retry-After
        (Retry-After, else DEFAULT_RETRY_AFTER); None for any other."""
        if status == 429 or (status == 503 and retry_after_header is not None):
            now = self.clock()
            return retry_after(retry_after_header, now) or now + DEFAULT_RETRY_AFTER
        return None

    def pause_early(self, group: str, status: int, retry_after_header: str | None) -> None:
        """A 429/503 head just came in: this worker sends nothing more to `group` from now,
        while the response's body is still read (`fetch` then blocks it in the queue). On a
        busy loop that took milliseconds, and requests went out meanwhile."""
        until = self.pause_for(status, retry_after_header)
        if until is not None:
            self._blocked[group] = max(until, self._blocked.get(group, 0.0))

    async def fetch(
        self,
        fetcher: Fetcher,
        url: str,
        *,
        group: str | None = None,
        groups: Mapping[str, str] | None = None,
        scope: Callable[[str], Any] | None = None,
        **options: Any,
    ) -> Response:
        """Fetches `url` politely. `group` is the first hop's group (default: its host);
        later hops count against their host. Raises Throttled when the server asks for a
        pause (the group is then blocked), FetchError for every other failure."""
        if self.backend.epoch != self._epoch:
            await self._store_again()
        if fetcher.robots.store is None:
            fetcher.robots.store = self.backend  # robots.txt answers shared by every worker
        self.tidy(fetcher)
        first = group or url_host(url)

        def group_of(hop: str) -> str:
            return first if hop == url else hop_host(url, hop)

        async def check(hop: str) -> None:
            if scope is not None:
                scope(hop)
            self.check_open(group_of(hop), hop)

        async def pace(hop: str) -> Slot | Unpaced:
            hop_group = group_of(hop)
            # A host's first requests are paced before any answer came back: the robots.txt
            # one of them fetched may already ask for a Crawl-delay.
            await self._apply_delay(fetcher, hop, hop_group)
            slot = await self.pace(hop_group, hop, fetcher)
            self.check_open(hop_group, hop)  # again: a 429 may have come meanwhile
            return slot

        try:
            response = await fetcher.fetch(url, check=check, pace=pace, **options)
        except FetchError as exc:
            await self._apply_delays(fetcher, exc.responses, exc.url, group_of)
            if exc.until is not None and not isinstance(exc, Throttled):
                # The site's robots.txt is unreachable: nothing of it is worth a claim before
                # robots.txt is asked again.
                await self.block(group_of(exc.url), exc.until, exc.detail or exc.reason.value)
            if exc.reason in HOST_TROUBLE:
                await self.failed(group_of(exc.url), exc.reason.value)
            raise
        await self._apply_delays(fetcher, response.chain, url, group_of)
        last_group = group_of(response.url)
        until = self.pause_for(response.status, response.header("Retry-After"))
        if until is not None:
            reason = f"{response.status} Retry-After {response.header('Retry-After') or '-'}"
            await self.block(last_group, until, reason)
            raise Throttled(response.url, until, reason, responses=response.chain, answered=True)
        for hop in response.history:  # each answered, so none has failed in a row
            self._failures.pop(group_of(hop.url), None)
        if response.status >= 500:
            await self.failed(last_group, f"HTTP {response.status}")
        else:
            self._failures.pop(last_group, None)
        return response

    async def _apply_delays(
        self,
        fetcher: Fetcher,
        responses: tuple[Response, ...],
        url: str,
        group_of: Callable[[str], str],
    ) -> None:
        for hop in {r.url for r in responses} | {url}:
            await self._apply_delay(fetcher, hop, group_of(hop))

    async def _apply_delay(self, fetcher: Fetcher, url: str, group: str) -> None:
        """The Crawl-delay robots.txt of `url`'s origin asks, if known, raises `group`'s
        interval."""
        delay = fetcher.robots.delay(url)
        if delay is not None:
            await self.crawl_delay(group, min(delay, fetcher.settings.max_crawl_delay))

    async def crawl_delay(self, group: str, seconds: float) -> None:
        """Raises `group`'s interval to `seconds` if it is lower; never lowers it."""
        if self._delays.get(group, -1.0) >= seconds:
            return
        self._delays[group] = seconds
        self._intervals.pop(group, None)
        await self.backend.raise_crawl_delays({group: seconds})

    async def block(self, group: str, until: float, reason: str) -> None:
        self._blocked[group] = max(until, self._blocked.get(group, 0.0))
        self._block_reasons[group] = reason
        await self.backend.block_group(group, until, reason)

    async def _store_again(self) -> None:
        """A Redis back from a crash may have lost the Crawl-delays and blocks this worker
        stored: every other worker would then pace by the plain rule, or send to a host
        that asked for a pause. They are stored again (each worker, what it heard), by the
        first request that finds the new epoch; should that fail, by the next one. The
        request itself goes on: this worker keeps to them either way."""
        old, self._epoch = self._epoch, self.backend.epoch
        self._limits = None
        try:
            if self._delays:
                await self.backend.raise_crawl_delays(self._delays)
            for group in list(self._blocked):
                until = self.blocked_until(group)
                if until is not None:
                    reason = self._block_reasons.get(group, "")
                    await self.backend.block_group(group, until, reason)
        except BackendError as exc:
            self._epoch = old
            log.warning("storing Crawl-delays and pauses again failed (%s); next request", exc)

    async def failed(self, group: str, what: str) -> None:
        count = self._failures.get(group, (0, 0.0))[0] + 1
        self._failures[group] = (count, self.clock())
        pause = self.backoff.pause(count)
        if pause is not None:
            reason = f"backing off {pause:g}s: {count} failures in a row (last: {what})"
            await self.block(group, self.clock() + pause, reason)


__all__ = ["Backoff", "Politeness", "Reason", "retry_after"]


def hop_host(url: str, hop: str) -> str:
    """The host of `hop`, a URL a redirect of `url` led to; a bad response of `url` when it
    has no host name (a scope reads hosts more loosely, or not at all)."""
    try:
        return url_host(hop)
    except InvalidElement as exc:
        raise FetchError(Reason.BAD_RESPONSE, url, f"a redirect to {exc.reason}") from exc
