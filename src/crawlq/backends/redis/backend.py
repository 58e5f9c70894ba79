"""The Redis backend: the same queue on a shared engine, so workers on many machines keep
politeness cluster-wide. Each operation is one Lua function (lua/, loaded as one library by
scripts.py), one atomic step and one round trip; the key layout is documented in
lua/common.lua and docs/redis.md.
"""

from __future__ import annotations

import asyncio
import builtins
import math
import os
import socket
import struct
import time
from collections.abc import Awaitable, Callable, Collection, Mapping, Sequence
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import msgpack
from redis import Redis as SyncRedis
from redis.asyncio import Redis
from redis.asyncio.retry import Retry
from redis.backoff import ExponentialBackoff
from redis.exceptions import (
    AuthenticationError,
    BusyLoadingError,
    ConnectionError,
    NoPermissionError,
    OutOfMemoryError,
    ReadOnlyError,
    RedisError,
    ResponseError,
    TimeoutError,
)

from ...errors import BackendError, BackendUnavailable, ConfigError, UnknownQueue
from ...identity import key_hash
from ...limits import DEFAULT_LIMIT, checked_crawl_delays, specificity
from ...observe.logs import redact
from ...types import (
    ORIGINS,
    Attempt,
    Claimed,
    ClaimResult,
    DeadLetter,
    ElementInfo,
    Failure,
    GroupBy,
    GroupStats,
    Leases,
    Limit,
    LimitRule,
    Origin,
    QueueConfig,
    QueueStats,
    Schedule,
    ScheduleResult,
    WorkerInfo,
    lease_of,
)
from ...wakeup import Listener
from ..base import WORKER_TTL
from ..batch import (
    check_block_until,
    check_failures,
    check_leases,
    check_robots_answer,
    check_schedule,
    merge,
)
from ..views import dead_element, live_element
from . import lanes, records, scripts
from .check import check
from .globs import lua_pattern
from .lanes import Lanes
from .listener import RedisListener
from .restarts import RestartWatch

DEFAULT_NAMESPACE = "crawlq"
#: The "seen" digests are spread over this many sets, so each stays a compact intset.
SEEN_BUCKETS = 1 << 18
SCHEMA_VERSION = "7"
#: Heads a kept robots.txt answer (`keep_robots_answer`): until when it stands.
ROBOTS_TIME = struct.Struct(">d")
#: Elements one call takes at most (a schedule, a claim, dead letters requeued): Redis serves
#: nobody else while a function runs, ~40 us an element here, and a 200,000-element
#: schedule held every other client off for 8.5 s (BUSY once past 5 s).
CALL_ITEMS = 5_000
#: How long a call waits for a restarting Redis before its error surfaces.
RECONNECT_PATIENCE = 15.0
MAX_RECONNECT_PAUSE = 2.0
#: The probe's limit on connecting, and then on each read (a TLS handshake included): a
#: server that accepts and never answers (a wedged proxy, a TLS port asked in plain text or
#: the reverse) is reported instead of waited for forever.
PROBE_TIMEOUT = 5.0
#: How long opening may take in all (the probe, PING, loading the functions) before the
#: backend is reported unreachable.
OPEN_TIMEOUT = 15.0


def split_namespace(url: str) -> tuple[str, str]:
    """Takes crawlq's own `namespace` option out of the query; redis-py gets the rest."""
    parts = urlsplit(url)
    if not parts.hostname:  # redis-py would fail on connecting, with a traceback
        raise ConfigError(f"Redis URL {redact(url)!r} names no host (as in redis://HOST:6379/0)")
    query = parse_qsl(parts.query, keep_blank_values=True)
    namespace = DEFAULT_NAMESPACE
    rest = []
    for name, value in query:
        if name == "namespace":
            namespace = value
        else:
            rest.append((name, value))
    if not namespace or any(ch in namespace for ch in "{}"):
        raise ConfigError(f"Redis namespace {namespace!r} must be non-empty, without braces")
    return urlunsplit(parts._replace(query=urlencode(rest))), namespace


def _packed(value: Any) -> bytes:
    packed: bytes = msgpack.packb(value, use_bin_type=False)
    return packed


def _unpacked(raw: bytes) -> Any:
    return msgpack.unpackb(raw, raw=False, strict_map_key=False)


def _digests(key: str) -> tuple[bytes, str, str]:
    """The key's 64-bit digest: as its field in the element buckets (its first bytes, sent as
    msgpack bin so the scripts need not decode hex), and the signed decimal and bucket the
    "seen" sets store."""
    digest = key_hash(key)
    return records.field_of(digest), str(digest), str(digest % SEEN_BUCKETS)


#: A server that vanished without a word (no RST: a cut network, a dead machine) is given up
#: on within about a minute, freeing the connection and its caller, where the kernel's
#: defaults wait two hours when idle and some fifteen minutes with a request unanswered. A
#: timeout on every reply would do as much but costs a timer per call (~17% of a one-element
#: schedule's rate here).
_KEEPALIVE: dict[int, int] = {
    option: value
    for name, value in (
        ("TCP_KEEPIDLE", 30),
        ("TCP_KEEPINTVL", 10),
        ("TCP_KEEPCNT", 3),
        ("TCP_USER_TIMEOUT", 60_000),  # ms an unacknowledged request may wait
    )
    if (option := getattr(socket, name, None)) is not None
}


class RedisBackend:
    def __init__(
        self, url: str, *, clock: Callable[[], float] | None = None, create: bool = True
    ) -> None:
        self._url, namespace = split_namespace(url)
        self.url = redact(url)
        # Scripts use the server's clock unless one is given; `now()` is then this machine's
        # reading of about the same time, for what is computed here (due times, retries),
        # corrected by the skew seen on connecting (restarts.py).
        self.now = clock or self._server_now
        self._clock = clock
        self.namespace = namespace
        self.prefix = "{" + namespace + "}:"
        self._anchor = self.prefix + "queues"
        self._create = create
        self._client: Redis | None = None
        self._lanes: Lanes | None = None
        self._restarts = RestartWatch()
        self._loading = False  # the server said it was loading its data, while opening

    async def __aenter__(self) -> RedisBackend:
        await self.open()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # -- connection ---------------------------------------------------------------------------

    async def open(self) -> None:
        if self._client is not None:
            return
        # redis-py types these as its own errors only; it catches whatever it is given.
        retried: Any = (ConnectionError, TimeoutError, OSError)
        options: dict[str, Any] = {
            "socket_connect_timeout": 5.0,
            "socket_keepalive": True,
            "socket_keepalive_options": _KEEPALIVE,
            "health_check_interval": 30,
            # A restarting server is waited for (about 15 s), then the error surfaces. OSError
            # too: a refused connection (the server not listening yet) is not redis-py's
            # ConnectionError, and without it a call needing a new connection failed at once.
            "retry": Retry(
                ExponentialBackoff(cap=2.0, base=0.05),
                retries=12,
                supported_errors=retried,
            ),
            "retry_on_error": [ConnectionError, TimeoutError],
            "redis_connect_func": self._restarts.on_connect,
        }
        try:
            client = Redis.from_url(self._url, **options)
            # redis-py takes any ?name=value as a connection argument and only fails, with a
            # TypeError, on connecting: a connection made (not opened) here names a misspelt one.
            client.connection_pool.make_connection()
        except (ValueError, TypeError) as exc:
            raise ConfigError(f"bad Redis URL {self.url}: {exc}") from None
        try:
            async with asyncio.timeout(OPEN_TIMEOUT):
                await self._probe_patiently()
                await client.ping()
                await self._load_scripts(client)
                fresh = await client.set(self.prefix + "version", SCHEMA_VERSION, nx=True)
                if fresh:
                    if not self._create:
                        await client.delete(self.prefix + "version")
                        raise BackendUnavailable(
                            f"no crawlq data in namespace {self.namespace!r} at {self.url}"
                        )
                    await self._set_default_limit(client)
                elif (
                    stored := await client.get(self.prefix + "version")
                ) != SCHEMA_VERSION.encode():
                    raise BackendError(
                        f"namespace {self.namespace!r} at {self.url} holds crawlq data of layout "
                        f"{stored.decode() if stored else '?'}; this crawlq reads layout "
                        f"{SCHEMA_VERSION}: finish it with the crawlq that wrote it, or use "
                        "another namespace (?namespace=NAME)"
                    )
        except ResponseError as exc:  # reached, and refused: a replica, a full server, an ACL
            await client.aclose()
            raise BackendUnavailable(f"cannot use Redis at {self.url}: {exc}{_hint(exc)}") from None
        except AuthenticationError as exc:  # reached, and the login refused (a ConnectionError)
            await client.aclose()
            raise self._failure(exc) from None
        except RedisError as exc:
            await client.aclose()
            raise BackendUnavailable(
                f"cannot reach Redis at {self.url}: {exc}{self._tls_hint(exc)}"
            ) from None
        except builtins.TimeoutError:  # asyncio.timeout's (redis-py's own is a RedisError)
            await client.aclose()
            why = "still loading its data after" if self._loading else "no answer in"
            raise BackendUnavailable(
                f"cannot reach Redis at {self.url}: {why} {OPEN_TIMEOUT:g} s"
            ) from None
        except BaseException:
            await client.aclose()
            raise
        self._client = client
        self._lanes = Lanes(client)
        if not fresh:  # Crawl-delay rules an older crawlq stored become Crawl-delays
            try:
                await self._run("crawl_delays", [True])
            except BaseException:  # an ACL without FCALL: not left half open, connected
                await self.close()
                raise

    async def _load_scripts(self, client: Redis) -> None:
        """Loads the function library; a user who may not (an ACL without FUNCTION LOAD) needs
        it only when the server does not have this version of it."""
        try:
            await scripts.load(client)
        except NoPermissionError:
            if not await self._library_loaded(client):
                raise
        except ResponseError as exc:
            if "unknown command" not in str(exc).lower():
                raise
            info: Any = await client.info("server")
            raise BackendError(
                f"Redis at {self.url} is version {info.get('redis_version', '?')}: crawlq "
                "needs Redis 7.0 or later (its operations are a Redis function library)"
            ) from None

    async def _library_loaded(self, client: Redis) -> bool:
        """Whether the server has this crawlq's library: crawl_delays with nothing to raise
        and nothing to adopt, an operation that changes nothing (FCALL alone asked of the
        user, where FUNCTION LIST would ask for one more permission)."""
        untyped: Any = client  # redis-py types its asyncio commands as "awaitable or value"
        args = [self.prefix, self._clock_arg(), _packed([False])]
        try:
            await untyped.fcall(scripts.function_name("crawl_delays"), 1, self._anchor, *args)
        except ResponseError as exc:
            if scripts.missing(exc):
                return False
            raise
        return True

    def _login_hint(self) -> str:
        """What a refused login may need; never the password itself."""
        parts = urlsplit(self._url)
        query = parse_qsl(parts.query, keep_blank_values=True)
        if parts.password is None and all(name != "password" for name, _ in query):
            return " (the URL gives no password: put USER:PASSWORD@ before its host)"
        return ""

    def _tls_hint(self, exc: RedisError) -> str:
        """A TLS URL to a plain port waits for a handshake that never comes (a timeout); a
        plain one to a TLS port is cut off (reset) or answered in TLS records."""
        tls = self._url.startswith("rediss://")
        if tls and isinstance(exc, TimeoutError):
            return " (a plain-text port? rediss:// speaks TLS; use redis:// for it)"
        said = str(exc).lower()
        if not tls and ("reset by peer" in said or "protocol error" in said):
            return " (a TLS port? use rediss:// for it)"
        return ""

    async def _probe_patiently(self) -> None:
        """The probe, waited for while the server loads its data (a restart of a big one):
        a worker started with it then starts once it is loaded, instead of failing at once
        with "Redis is loading the dataset in memory". Bounded by OPEN_TIMEOUT."""
        pause = 0.05
        while True:
            try:
                await asyncio.to_thread(self._probe)
                return
            except BusyLoadingError:
                self._loading = True
                await asyncio.sleep(pause)
                pause = min(MAX_RECONNECT_PAUSE / 4, pause * 2)

    def _probe(self) -> None:
        """One PING without retries, so a server that is not there is reported at once. With
        the blocking client: a refused login or handshake closes its socket right away, and
        one that never answers times out (the timeout bounds a TLS handshake too)."""
        with SyncRedis.from_url(
            self._url, socket_connect_timeout=PROBE_TIMEOUT, socket_timeout=PROBE_TIMEOUT
        ) as probe:
            probe.ping()

    async def _set_default_limit(self, client: Redis) -> None:
        rule = _rule(LimitRule(pattern="*", limit=DEFAULT_LIMIT))
        stored: Any = client.hset(self.prefix + "limits", mapping={rule[0]: _packed(rule[1:])})
        await stored  # redis-py types its asyncio commands as "Awaitable or value"

    async def close(self) -> None:
        if self._lanes is not None:
            await self._lanes.close()
            self._lanes = None
        if self._client is not None:
            await self._client.aclose()
            self._client = None

    def _server_now(self) -> float:
        return time.time() + self._restarts.offset

    @property
    def epoch(self) -> int:
        return self._restarts.epoch

    @property
    def client(self) -> Redis:
        if self._client is None:
            raise BackendError(f"backend {self.url} is not open")
        return self._client

    def _clock_arg(self) -> str:
        return repr(self._clock()) if self._clock is not None else ""

    async def _patiently(self, call: Callable[[], Awaitable[Any]]) -> Any:
        """redis-py sends a command again when its connection breaks, but not when a new
        connection breaks in its handshake (a server going down or just coming up): such
        calls are tried again here, for up to RECONNECT_PATIENCE seconds in all. Running a
        script twice is safe: each is idempotent or fenced by the lease, and a claim sent
        again gets the reply it lost (claim.lua)."""
        started = time.monotonic()
        pause = 0.05
        while True:
            try:
                return await call()
            except (ConnectionError, TimeoutError):
                if time.monotonic() + pause > started + RECONNECT_PATIENCE:
                    raise
                await asyncio.sleep(pause)
                pause = min(MAX_RECONNECT_PAUSE, pause * 2)

    async def _run(self, script: str, payload: Any, *extra: str, again: Any = None) -> Any:
        """One operation; sent again after a broken connection, with `again` as its payload
        if given."""
        held = self._lanes
        if held is None:
            raise BackendError(f"backend {self.url} is not open")
        sent = 0

        def call() -> Awaitable[Any]:
            nonlocal sent
            sent += 1
            chosen = payload if sent == 1 or again is None else again
            args: list[str | bytes] = [self.prefix, self._clock_arg(), _packed(chosen), *extra]
            return scripts.call(held, script, [self._anchor], args)

        try:
            return await self._patiently(call)
        except RedisError as exc:
            raise self._failure(exc, f" in {script}") from None

    def _failure(self, exc: RedisError, where: str = "") -> BackendError:
        """A running call's error as crawlq reports it. A login refused on reconnecting (the
        password changed under a running worker) is said as such, not as a lost server."""
        if isinstance(exc, AuthenticationError):
            why = f"{exc}{self._login_hint()}"
            return BackendUnavailable(f"Redis at {self.url} refused the credentials: {why}")
        if isinstance(exc, (ConnectionError, TimeoutError)):
            return BackendUnavailable(f"lost Redis at {self.url}: {exc}")
        return BackendError(f"Redis at {self.url} failed{where}: {exc}{_hint(exc)}")

    async def _call(self, fn: Callable[[], Any]) -> Any:
        """Plain commands, with the same error translation as scripts. They go over redis-py's
        pool, which waits for a reply forever (no socket_timeout: it would apply to the lanes
        and the wake-up listener too), so each try is bounded here as the lanes bound theirs
        (a stopped redis-server acknowledges at the TCP level and never answers)."""

        async def bounded() -> Any:
            try:
                async with asyncio.timeout(lanes.CALL_TIMEOUT):
                    return await fn()
            except builtins.TimeoutError:  # asyncio's; redis-py's own is a RedisError
                raise TimeoutError(
                    f"no reply from Redis in {lanes.CALL_TIMEOUT:g} s (is redis-server stopped "
                    "or overloaded?)"
                ) from None

        try:
            return await self._patiently(bounded)
        except RedisError as exc:
            raise self._failure(exc) from None

    async def _hget(self, key: str, field: bytes | str) -> bytes | None:
        async def read() -> bytes | None:
            client: Any = self.client  # redis-py types hget "str -> awaitable or value"
            pending: Any = client.hget(key, field)
            raw: bytes | None = await pending
            return raw

        raw: bytes | None = await self._call(read)
        return raw

    def _queue_key(self, queue: str, kind: str) -> str:
        return f"{self.prefix}q:{len(queue.encode())}:{queue}:{kind}"

    async def listen(self, queues: Sequence[str]) -> Listener:
        channels = [f"{self.prefix}wake:{queue}" for queue in queues]
        listener = RedisListener(self.client, channels)
        try:
            # Bounded as every call is: it waits for the server to confirm the subscriptions.
            async with asyncio.timeout(lanes.CALL_TIMEOUT):
                return await listener.started()
        except RedisError as exc:  # an ACL without these channels: NOPERM, not a traceback
            await listener.close()
            raise BackendError(
                f"Redis at {self.url} refused the wake-up channels {self.prefix}wake:*: {exc}"
            ) from None
        except builtins.TimeoutError:
            await listener.close()
            raise BackendUnavailable(
                f"lost Redis at {self.url}: no reply from Redis in {lanes.CALL_TIMEOUT:g} s "
                "(is redis-server stopped or overloaded?)"
            ) from None

    # -- queues -------------------------------------------------------------------------------

    async def ensure_queues(self, configs: Sequence[QueueConfig]) -> None:
        if not configs:
            return
        mapping = {c.name: _packed([c.group_by.value, c.custom_key, c.seen]) for c in configs}

        async def store() -> bool:
            async with self.client.pipeline(transaction=True) as pipe:
                pipe.hset(self._anchor, mapping=mapping)
                # The namespace's mark too: a Redis back without its data (no persistence)
                # lost it, and `crawlq stats` and the dashboard (which open without creating)
                # said "no crawlq data" while the workers, storing their queues again,
                # went on.
                pipe.set(self.prefix + "version", SCHEMA_VERSION, nx=True)
                _, fresh = await pipe.execute()
                return bool(fresh)

        if await self._call(store):
            await self._call(lambda: self._set_default_limit(self.client))

    async def queues(self) -> list[QueueConfig]:
        stored = await self._call(lambda: self.client.hgetall(self._anchor))
        configs = []
        for name, raw in stored.items():
            by, custom, seen = _unpacked(raw)
            configs.append(
                QueueConfig(name=name.decode(), group_by=GroupBy(by), custom_key=custom, seen=seen)
            )
        return sorted(configs, key=lambda c: c.name)

    # -- schedule, claim, finish --------------------------------------------------------------

    async def schedule(self, items: Sequence[Schedule]) -> ScheduleResult:
        if not items:
            return ScheduleResult()
        for item in items:
            check_schedule(item)
        epoch = self._restarts.epoch  # (an attribute: a single schedule's path is counted)
        try:
            if len(items) == 1:  # the most common call: nothing to fold, one call
                return await self._schedule_once(items)
            result = ScheduleResult()
            rounds = merge(items)  # nearly always one
            if len(rounds) > 1 or len(rounds[0]) > CALL_ITEMS:
                await self._known(*{item.queue for item in items})  # before any call writes
            for round_ in rounds:
                for start in range(0, len(round_), CALL_ITEMS):
                    result += await self._schedule_once(round_[start : start + CALL_ITEMS])
            return result
        except UnknownQueue as exc:
            if self._restarts.epoch == epoch:
                raise
            # Not the caller's mistake: Redis came back without its data (no appendonly).
            raise BackendError(
                f"Redis at {self.url} restarted during this schedule and came back without "
                f"queue {exc.queue!r}: it lost its data (run it with appendonly yes). Store "
                "the app's queues again (any worker does) and schedule again"
            ) from None

    async def _schedule_once(self, merged: Sequence[Schedule]) -> ScheduleResult:
        """A batch holding each element once."""
        batch = []
        for item in merged:
            batch.append(
                [
                    item.queue,
                    item.key,
                    item.payload if item.payload is not None else False,
                    item.group,
                    item.due,
                    item.priority,
                    item.mode.value,
                    *_digests(item.key),
                    item.revisit,
                ]
            )
        result = _unpacked(await self._run("schedule", batch))
        if result[0] is False:
            raise UnknownQueue(result[1])
        added, moved, kept, deferred, skipped = result
        return ScheduleResult(
            added=added, moved=moved, kept=kept, deferred=deferred, skipped_seen=skipped
        )

    async def claim(
        self, queues: Sequence[str], *, worker: str, limit: int, lease: Leases
    ) -> ClaimResult:
        check_leases(lease, queues)
        token = os.urandom(8)
        taking = min(limit, CALL_ITEMS)
        sent = {q: lease[q] for q in queues} if isinstance(lease, Mapping) else lease
        raw = await self._run(
            "claim",
            [worker, taking, sent, token, False, *queues],
            again=[worker, taking, sent, token, True, *queues],
        )
        next_at, now, *rows = _unpacked(raw)
        if len(rows) == taking < limit:
            next_at = now  # a call takes at most CALL_ITEMS: more may be claimable at once
        elements = [
            Claimed(
                ref=ref,
                queue=queue,
                key=key,
                payload=payload,
                group=group,
                priority=int(priority),
                due=float(due),
                attempt=attempt,
                claimed_at=now,
                lease_until=now + lease_of(lease, queue),
            )
            for queue, key, payload, group, priority, due, attempt, ref in rows
        ]
        return ClaimResult(elements=elements, next_at=None if next_at is False else next_at)

    async def _settle(self, action: str, failures: Sequence[Failure]) -> None:
        items = []
        for failure in failures:
            element = failure.element
            retry_at = failure.retry_at if failure.retry_at is not None else False
            items.append(
                [
                    element.queue,
                    element.key,
                    element.ref,
                    element.attempt,
                    *_digests(element.key),
                    element.due,
                    retry_at,
                    failure.error,
                    failure.traceback,
                    element.claimed_at,
                ]
            )
        await self._run("settle", [action, *items])

    async def ack(self, elements: Sequence[Claimed]) -> None:
        if elements:
            await self._settle("ack", [Failure(element=e, error="") for e in elements])

    async def fail(self, failures: Sequence[Failure]) -> None:
        check_failures(failures)
        if failures:
            await self._settle("fail", failures)

    async def finish(
        self, follow: Sequence[Schedule], acks: Sequence[Claimed], failures: Sequence[Failure]
    ) -> None:
        check_failures(failures)  # before the follow-ups and acks are written
        if follow:
            await self.schedule(follow)
        await self.ack(acks)
        await self.fail(failures)

    async def release(self, elements: Sequence[Claimed]) -> None:
        if elements:
            await self._settle("release", [Failure(element=e, error="") for e in elements])

    async def heartbeat(
        self, worker: WorkerInfo, elements: Sequence[Claimed], lease: Leases
    ) -> None:
        check_leases(lease, {e.queue for e in elements})
        items = [
            [e.queue, e.key, e.ref, e.attempt, _digests(e.key)[0], e.claimed_at] for e in elements
        ]
        sent = dict(lease) if isinstance(lease, Mapping) else lease
        if not await self._run("heartbeat", [worker.id, sent, *items]):
            await self.register_worker(worker)  # pruned while its heartbeats stalled

    # -- workers ------------------------------------------------------------------------------

    async def register_worker(self, worker: WorkerInfo) -> None:
        info = [
            worker.id,
            worker.host,
            worker.pid,
            ",".join(worker.queues),
            worker.wake_address,
            worker.concurrency,
        ]
        await self._run("workers", info, repr(WORKER_TTL))

    async def unregister_worker(self, worker_id: str) -> None:
        async def forget() -> None:
            async with self.client.pipeline(transaction=True) as pipe:
                pipe.hdel(self.prefix + "workers", worker_id)
                pipe.delete(self.prefix + "w:" + worker_id)
                await pipe.execute()

        await self._call(forget)

    async def workers(self) -> list[WorkerInfo]:
        async def read() -> tuple[dict[bytes, bytes], list[int]]:
            infos = await self.client.hgetall(self.prefix + "workers")  # type: ignore[misc]
            async with self.client.pipeline(transaction=False) as pipe:
                for wid in infos:
                    pipe.scard(self.prefix + "w:" + wid.decode())
                held = await pipe.execute()
            return infos, held

        infos, held = await self._call(read)
        found = []
        for (wid, raw), running in zip(infos.items(), held, strict=True):
            host, pid, queues, started, beat, address, concurrency = _unpacked(raw)
            found.append(
                WorkerInfo(
                    id=wid.decode(),
                    host=host,
                    pid=pid,
                    queues=tuple(q for q in queues.split(",") if q),
                    started=started,
                    heartbeat=beat,
                    wake_address=address,
                    running=int(running),
                    concurrency=concurrency,
                )
            )
        return sorted(found, key=lambda w: w.started)

    # -- limits and blocks --------------------------------------------------------------------

    async def limits(self) -> list[LimitRule]:
        globs = await self._call(lambda: self.client.hgetall(self.prefix + "limits"))
        exact = await self._call(lambda: self.client.hgetall(self.prefix + "lx"))
        origins = await self._call(lambda: self.client.hgetall(self.prefix + "lo"))
        rules = []
        for pattern, raw in {**globs, **exact}.items():
            _, _, _, concurrency, interval = _unpacked(raw)
            limit = Limit(concurrency=concurrency or None, interval=float(interval))
            origin = _origin(origins.get(pattern, b"app"))
            rules.append(LimitRule(pattern=pattern.decode(), limit=limit, origin=origin))
        return sorted(rules, key=lambda r: r.pattern)

    async def set_limits(self, rules: Sequence[LimitRule]) -> None:
        await self._run("limits", [False, *([*_rule(r), r.origin] for r in rules)])

    async def delete_limit(self, pattern: str) -> bool:
        return bool(await self._run("limits", [pattern]))

    async def crawl_delays(self, groups: Collection[str] | None = None) -> dict[str, float]:
        if groups is None:
            stored = await self._call(lambda: self.client.hgetall(self.prefix + "cd"))
            return {name.decode(): float(seconds) for name, seconds in sorted(stored.items())}
        names = list(groups)
        if not names:
            return {}
        found = await self._call(lambda: self.client.hmget(self.prefix + "cd", names))
        return {
            name: float(seconds)
            for name, seconds in zip(names, found, strict=True)
            if seconds is not None
        }

    async def raise_crawl_delays(self, delays: Mapping[str, float]) -> None:
        checked = checked_crawl_delays(delays)
        pairs = [item for name, seconds in checked.items() for item in (name, seconds)]
        await self._run("crawl_delays", [False, *pairs])

    async def robots_answer(self, origin: str) -> tuple[bytes, float] | None:
        kept = await self._call(lambda: self.client.get(self.prefix + "ra:" + origin))
        if kept is None or len(kept) < ROBOTS_TIME.size:
            return None
        left = ROBOTS_TIME.unpack_from(kept)[0] - self.now()
        return (kept[ROBOTS_TIME.size :], left) if left > 0 else None

    async def keep_robots_answer(self, origin: str, answer: bytes, seconds: float) -> None:
        check_robots_answer(origin, answer, seconds)
        kept = ROBOTS_TIME.pack(self.now() + seconds) + answer
        # Redis forgets it by its own clock, a second after the time the reader goes by.
        expiry = math.ceil(seconds * 1000) + 1000
        await self._call(lambda: self.client.set(self.prefix + "ra:" + origin, kept, px=expiry))

    async def block_group(self, group: str, until: float | None, reason: str | None) -> None:
        check_block_until(until)
        reason = reason if until is not None and reason else None
        await self._run("block", [group, until or False, reason or False])

    async def reserve_send(self, group: str, gap: float, earliest: float = 0.0) -> float:
        return (await self.reserve_send_slot(group, gap, earliest))[1]

    async def reserve_send_slot(
        self,
        group: str,
        gap: float,
        earliest: float = 0.0,
        *,
        replacing: float | None = None,
        max_wait: float | None = None,
    ) -> tuple[float, float, bool]:
        mine = False if replacing is None else replacing
        most = False if max_wait is None else max_wait
        at, wait, kept = await self._run("reserve_send", [group, gap, earliest, mine, most])
        return float(at), float(wait), bool(int(kept))

    # -- introspection ------------------------------------------------------------------------

    async def queue_stats(self, queues: Sequence[str] | None = None) -> list[QueueStats]:
        names = sorted(c.name for c in await self.queues())
        if queues is not None:
            names = [n for n in names if n in queues]
        now = self.now()

        async def read(transaction: bool = True) -> list[Any]:
            async with self.client.pipeline(transaction=transaction) as pipe:
                for name in names:
                    pipe.hmget(self._queue_key(name, "n"), ["0", "1", "2", "3"])
                    pipe.zcount(self._queue_key(name, "d"), "-inf", repr(now))
                try:
                    found: list[Any] = await pipe.execute()
                except OutOfMemoryError:
                    if not transaction:
                        raise
                    # A full Redis refuses every command inside MULTI, reads too, and
                    # `crawlq stats` is what an operator runs then: read without one.
                    return await read(False)
                return found

        found = await self._call(read)
        stats = []
        for i, name in enumerate(names):
            delayed, ready, running, dead = (int(n or 0) for n in found[2 * i])
            overdue = int(found[2 * i + 1])
            stats.append(
                QueueStats(
                    name=name,
                    total=delayed + ready + running,
                    due=ready + overdue,
                    delayed=delayed - overdue,
                    running=running,
                    dead=dead,
                )
            )
        return stats

    async def group_stats(
        self, pattern: str = "*", *, limit: int = 100, include_idle: bool = False
    ) -> list[GroupStats]:
        raw = await self._run("groups", [lua_pattern(pattern), limit, include_idle])
        stats = []
        for name, queued, running, concurrency, interval, last, blocked, reason in _unpacked(raw):
            limit_ = Limit(concurrency=concurrency or None, interval=interval)
            stats.append(
                GroupStats(
                    name=name,
                    queued=queued,
                    running=running,
                    limit=limit_,
                    next_start=last + interval if last is not False and interval else None,
                    blocked_until=None if blocked is False else blocked,
                    block_reason=None if reason is False else reason,
                )
            )
        return stats

    async def element(self, queue: str, key: str) -> ElementInfo | None:
        await self._known(queue)
        digest = _digests(key)[0]
        for field in (digest, digest + key.encode()):
            rec = await self._record(queue, field)
            if rec is not None and rec[records.KEY] == key:
                return self._element_info(queue, rec)
        raw = await self._hget(self._queue_key(queue, "x"), key)
        if raw is None:
            return None
        letter, past = _dead_letter(queue, key, raw)
        return dead_element(letter, _attempts(past))

    async def _record(self, queue: str, field: bytes) -> list[Any] | None:
        """The element record stored under `field`, decoded (records.py), or None. Its bucket
        is read again should the buckets have grown between reading their state and it."""
        state = None
        while True:
            read = await self._call(
                lambda: self.client.hmget(self._queue_key(queue, "eb"), ["l", "s"])
            )
            if read == state:
                return None
            state = read
            level, split = (int(n or 0) for n in state)
            raw = await self._hget(
                self._queue_key(queue, f"e:{records.bucket(field, level, split)}"), field
            )
            if raw is not None:
                break
        rec = records.unpack(raw)
        group = ""
        if rec[records.GROUP]:
            name = await self._hget(self.prefix + "gn", str(rec[records.GROUP]).encode())
            group = "" if name is None else name.decode()
        return records.resolve(rec, group)

    def _element_info(self, queue: str, rec: list[Any]) -> ElementInfo:
        """A decoded element record (records.py) as an ElementInfo."""
        key = rec[records.KEY]

        def given(field: int) -> Any:
            return None if rec[field] is False else rec[field]

        return live_element(
            queue=queue,
            key=key,
            payload=rec[records.PAYLOAD] if rec[records.PAYLOAD] is not False else key,
            group=rec[records.GROUP],
            state=rec[records.STATE],
            due=float(rec[records.DUE]),
            priority=int(rec[records.PRIORITY]),
            attempts=rec[records.ATTEMPTS],
            lease_until=given(records.LEASE),
            worker=given(records.WORKER),
            error=given(records.ERROR),
            next_due=given(records.NEXT_DUE),
            history=_attempts(rec[records.HISTORY] or []),
            now=self.now(),
        )

    async def worker_elements(self, worker_id: str, *, limit: int = 50) -> list[ElementInfo]:
        async def read() -> list[bytes]:
            members: list[bytes] = []
            held = self.prefix + "w:" + worker_id
            async for member in self.client.sscan_iter(held, count=limit):
                members.append(member)
                if len(members) >= limit:
                    break
            return members

        members: list[bytes] = await self._call(read)  # errors as every other call's
        found = []
        for member in sorted(members):
            length, _, rest = member.partition(b":")
            queue, field = rest[: int(length)].decode(), rest[int(length) :]
            rec = await self._record(queue, field)
            if rec is not None:
                found.append(self._element_info(queue, rec))
        return sorted(found, key=lambda e: (e.queue, e.key))  # as SQLite lists them

    async def check(self) -> list[str]:
        """Every broken internal invariant (empty when consistent); run on a quiet queue.
        Credentials masked: a problem names its element's key. Not bounded by CALL_TIMEOUT
        as a whole (it reads everything), but its errors are reported as every other call's."""
        try:
            problems = await check(self.client, self.prefix, self.now())
        except RedisError as exc:
            raise self._failure(exc) from None
        return [redact(problem) for problem in problems]

    # -- dead letters -------------------------------------------------------------------------

    async def _known(self, *queues: str) -> None:
        names = sorted(queues)
        stored = await self._call(lambda: self.client.hmget(self._anchor, names))
        for name, config in zip(names, stored, strict=True):
            if config is None:
                raise UnknownQueue(name)

    async def dead_letters(
        self, queue: str, *, limit: int = 100, offset: int = 0
    ) -> list[DeadLetter]:
        await self._known(queue)
        if limit <= 0:
            return []  # not ZREVRANGE's 0 to -1: everything
        order, dead = self._queue_key(queue, "xo"), self._queue_key(queue, "x")
        keys = await self._call(lambda: self.client.zrevrange(order, offset, offset + limit - 1))
        if not keys:
            return []
        letters = await self._call(lambda: self.client.hmget(dead, keys))
        found = []
        for key, raw in zip(keys, letters, strict=True):
            if raw is None:
                continue
            found.append(_dead_letter(queue, key.decode(), raw)[0])
        return found

    async def requeue_dead(self, queue: str, keys: Sequence[str] | None = None) -> int:
        return await self._take_dead(queue, True, keys)

    async def purge_dead(self, queue: str, keys: Sequence[str] | None = None) -> int:
        return await self._take_dead(queue, False, keys)

    async def _take_dead(self, queue: str, requeue: bool, keys: Sequence[str] | None) -> int:
        """Requeues or purges dead letters, CALL_ITEMS a call."""
        await self._known(queue)
        taken = 0
        if keys is None:
            while True:
                took = int(await self._run("dead", [queue, requeue, False, CALL_ITEMS]))
                taken += took
                if took < CALL_ITEMS:
                    return taken
        wanted = list(keys)
        for start in range(0, len(wanted), CALL_ITEMS):
            chunk = wanted[start : start + CALL_ITEMS]
            taken += int(await self._run("dead", [queue, requeue, chunk, CALL_ITEMS]))
        return taken


def _hint(exc: RedisError) -> str:
    """What to do about a refusal an operator can fix on the server's side."""
    if isinstance(exc, ReadOnlyError):
        return " (a read-only replica: point crawlq at the primary)"
    if isinstance(exc, OutOfMemoryError):
        return (
            " (Redis is full: nothing of this call was written; raise maxmemory or free "
            "memory, and keep maxmemory-policy noeviction)"
        )
    return ""


def _dead_letter(queue: str, key: str, raw: bytes) -> tuple[DeadLetter, list[list[Any]]]:
    """A stored dead letter (lua/common.lua, `x`) and the history it keeps; credentials in
    the error and traceback masked (workers store them masked, but not the letters stored
    before they did)."""
    payload, group, attempts, error, tb, died, _, history, *_ = _unpacked(raw)  # priority
    letter = DeadLetter(
        queue=queue,
        key=key,
        payload=key if payload is False else payload,
        group=group,
        attempts=attempts,
        error=redact(error) if error else error,
        traceback=redact(tb) if tb else tb,
        died_at=died,
    )
    return letter, history


def _attempts(history: list[list[Any]]) -> tuple[Attempt, ...]:
    return tuple(
        Attempt(attempt=n, claimed_at=at, worker=worker, outcome=outcome or None)
        for n, at, worker, outcome in history
    )


def _rule(rule: LimitRule) -> list[Any]:
    """A limit rule as the scripts store it: glob, Lua pattern, specificity, limit."""
    high, low = specificity(rule.pattern)
    concurrency = rule.limit.concurrency if rule.limit.concurrency is not None else False
    return [rule.pattern, lua_pattern(rule.pattern), high, low, concurrency, rule.limit.interval]


def _origin(stored: bytes) -> Origin:
    """A rule's origin as `lo` holds it."""
    return next((origin for origin in ORIGINS if stored == origin.encode()), "app")
