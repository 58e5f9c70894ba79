"""What only the Redis backend has: connection options (passwords, TLS, namespaces), clear
errors when Redis is not there, no password in messages, and glob rules matched in Lua
exactly as fnmatch matches them in Python."""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import time
from collections.abc import AsyncIterator, Callable, Iterator
from fnmatch import fnmatchcase
from pathlib import Path
from typing import Any

import msgpack
import pytest
import redis

from crawlq.backends import Backend, open_backend
from crawlq.backends.redis import records
from crawlq.backends.redis.globs import lua_pattern
from crawlq.backends.redis.lanes import Lanes, pack
from crawlq.errors import BackendError, BackendUnavailable, ConfigError, UnknownQueue
from crawlq.observe.logs import redact
from crawlq.tasks import prepare
from crawlq.testing.redis_server import RedisServer
from crawlq.types import JSON, Failure, GroupBy, Limit, LimitRule, QueueConfig, Schedule

from .conftest import QUEUES
from .helpers import (
    ManualClock,
    assert_a_rule_of_old_is_the_apps,
    claim,
    config,
    fill_for_damage,
    payloads,
    schedule,
    url,
)


@pytest.fixture
def secured(tmp_path: Path) -> Iterator[RedisServer]:
    server = RedisServer(password="s3cret-pw", tls=True)
    server.start()
    try:
        yield server
    finally:
        server.remove()


async def test_password_and_tls_are_honored(secured: RedisServer) -> None:
    assert secured.url.startswith("rediss://:s3cret-pw@")
    backend = open_backend(secured.url)
    await backend.open()
    try:
        await backend.ensure_queues([config("pages")])
        await schedule(backend, "pages", [url("a.test", 1)])
        (claimed,) = await claim(backend)
        assert claimed.group == "a.test"
        assert "s3cret-pw" not in backend.url
    finally:
        await backend.close()


async def test_a_wrong_password_is_a_clear_error_without_the_password(
    secured: RedisServer,
) -> None:
    wrong = secured.url.replace("s3cret-pw", "guess-pw")
    with pytest.raises(BackendUnavailable) as refused:
        await open_backend(wrong).open()
    # Refused, not unreachable: the login failed over TLS, the password masked in the URL.
    assert str(refused.value).startswith("Redis at rediss://***@127.0.0.1:"), refused.value
    assert " refused the credentials: " in str(refused.value)
    assert "guess-pw" not in str(refused.value)


async def test_plain_text_to_a_tls_server_is_refused(secured: RedisServer) -> None:
    plain = secured.url.replace("rediss://", "redis://").partition("?")[0]
    with pytest.raises(BackendUnavailable, match="cannot reach Redis"):
        await open_backend(plain).open()


async def test_an_unreachable_server_is_reported_at_once() -> None:
    server = RedisServer()  # a free port nobody listens on
    server.remove()
    with pytest.raises(
        BackendUnavailable, match=f"cannot reach Redis at redis://127.0.0.1:{server.port}"
    ):
        await open_backend(server.url).open()


def test_passwords_are_redacted_from_urls() -> None:
    assert redact("redis://:pw@h:1/0") == "redis://***@h:1/0"
    assert redact("rediss://user:pw@h/0?x=1") == "rediss://***@h/0?x=1"
    assert redact("redis://h:6379/0") == "redis://h:6379/0"


async def test_an_option_redis_py_does_not_take_is_a_config_error(
    redis_server: RedisServer,
) -> None:
    """A misspelt option in the URL (socket_timout) ended `crawlq stats` with redis-py's
    TypeError and its traceback: the URL's options go to redis-py's connections as they are."""
    url = redis_server.url + ("&" if "?" in redis_server.url else "?") + "socket_timout=10"
    backend = open_backend(url)
    with pytest.raises(ConfigError, match=r"bad Redis URL .*socket_timout"):
        await backend.open()
    await backend.close()


def test_bad_namespaces_are_refused() -> None:
    with pytest.raises(ConfigError, match="namespace"):
        open_backend("redis://127.0.0.1:1/0?namespace=a{b}")


@pytest.mark.parametrize("url", ["redis://", "redis:///0", "rediss://:pw@/0"])
def test_a_url_without_a_host_is_refused(url: str) -> None:
    """`crawlq stats --backend redis://` ended in redis-py's ValueError and its traceback."""
    with pytest.raises(ConfigError, match="names no host") as refused:
        open_backend(url)
    assert "pw" not in str(refused.value)


async def test_a_machine_whose_clock_is_off_schedules_by_the_servers(
    redis_server: RedisServer, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Scripts judge due times by Redis's clock; one scheduled "now" on a machine 30 s fast
    waited 30 s. The backend reads the server's time on connecting and schedules by it."""
    real = time.time
    monkeypatch.setattr(time, "time", lambda: real() + 30)
    backend = open_backend(f"{redis_server.url}?namespace=skew")
    await backend.open()
    try:
        await backend.ensure_queues([config("jobs")])
        await schedule(backend, "jobs", ["now"])
        taken = await claim(backend, "jobs")
        now = backend.now()
    finally:
        await backend.close()
    assert [c.payload for c in taken] == ['"now"']
    assert abs(now - real()) < 5
    assert "clock is 30.0 s ahead of Redis's" in caplog.text


async def test_a_claim_whose_reply_was_lost_gets_it_when_sent_again(
    redis_server: RedisServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The connection breaks after the server ran the claim and before its reply arrived: the
    claim is sent again, and returns what it leased rather than leasing more (the group of
    one slot would look full, and the lost element wait out its lease)."""
    backend = open_backend(f"{redis_server.url}?namespace=lost-reply")
    await backend.open()
    try:
        await backend.ensure_queues([config("pages")])
        await backend.set_limits([LimitRule(pattern="a.test", limit=Limit(concurrency=1))])
        await schedule(backend, "pages", [url("a.test", 1), url("a.test", 2)])
        lanes: Any = backend._lanes  # type: ignore[attr-defined]
        call, lost = lanes.call, list[Any]()

        async def losing_the_first_claims_reply(command: bytes) -> Any:
            reply = await call(command)
            if b"_claim" in command and not lost:
                lost.append(reply)
                raise redis.exceptions.ConnectionError("connection reset by peer")
            return reply

        monkeypatch.setattr(lanes, "call", losing_the_first_claims_reply)
        (first,) = await claim(backend, "pages")
        await backend.ack([first])
        (second,) = await claim(backend, "pages")
    finally:
        await backend.close()
    assert lost
    assert (first.payload, first.attempt) == (json.dumps(url("a.test", 1)), 1)
    assert second.payload == json.dumps(url("a.test", 2))


async def test_namespaces_keep_queues_apart(redis_server: RedisServer) -> None:
    one = open_backend(f"{redis_server.url}?namespace=one")
    two = open_backend(f"{redis_server.url}?namespace=two")
    await one.open()
    await two.open()
    try:
        for backend in (one, two):
            await backend.ensure_queues([config("jobs")])
        await schedule(one, "jobs", ["only in one"])
        assert await claim(two, "jobs") == []
        assert [c.payload for c in await claim(one, "jobs")] == ['"only in one"']
    finally:
        await one.close()
        await two.close()


async def test_a_server_that_lost_the_function_library_gets_it_again(
    redis_server: RedisServer,
) -> None:
    async with in_namespace(redis_server, "lost-library") as (backend, client):
        await backend.ensure_queues([config("jobs")])
        client.function_flush()  # as a restart without persistence would leave it
        assert client.function_list() == []
        await schedule(backend, "jobs", ["after the flush"])
        assert [c.payload for c in await claim(backend, "jobs")] == ['"after the flush"']
        libraries: Any = client.function_list()  # typed "awaitable or value"
        assert len(libraries) == 1


@contextlib.asynccontextmanager
async def in_namespace(server: RedisServer, namespace: str) -> AsyncIterator[tuple[Backend, Any]]:
    """A backend open on `namespace`, and a plain client (typed "awaitable or value") to look
    at or damage what it stored."""
    backend = open_backend(f"{server.url}?namespace={namespace}")
    await backend.open()
    client: Any = redis.Redis.from_url(server.url)
    try:
        yield backend, client
    finally:
        client.close()
        await backend.close()


@contextlib.asynccontextmanager
async def lanes_to(url: str, **options: Any) -> AsyncIterator[tuple[Lanes, Any]]:
    """Lanes on a client of `url` (its connections named LANES), and a plain client to watch
    the server with."""
    client = redis.asyncio.Redis.from_url(url, client_name=LANES)
    watcher: Any = redis.Redis.from_url(url.partition("?")[0])  # typed "awaitable or value"
    lanes = Lanes(client, **options)
    try:
        yield lanes, watcher
    finally:
        await lanes.close()
        await client.aclose()
        watcher.close()


LANES = "lanes-test"


async def until(check: Callable[[], bool], what: str) -> None:
    for _ in range(1000):
        if check():
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"waited 10 s for {what}")


async def wait_for_lanes(watcher: Any, count: int) -> None:
    """Until the server counts `count` lane connections (it sees a close on its next turn);
    the server is shared with other tests, so only the lanes' own are counted."""

    await until(lambda: len(lanes_of(watcher)) == count, f"{count} lanes open")


def lanes_of(watcher: Any, command: str | None = None) -> list[dict[str, Any]]:
    """The lane connections, those whose last command was `command` if given."""
    found = [c for c in watcher.client_list() if c["name"] == LANES]
    return [c for c in found if command is None or c["cmd"] == command]


def blocked_lanes(watcher: Any) -> int:
    return len(lanes_of(watcher, "blpop"))


async def test_lanes_keep_to_max_connections_and_calls_beyond_wait(
    redis_server: RedisServer,
) -> None:
    """Ten calls at once on `?max_connections=3`: three connections, the rest wait their
    turn, none fails."""
    async with lanes_to(f"{redis_server.url}?max_connections=3") as (lanes, watcher):
        assert lanes.max_lanes == 3
        calls = [asyncio.ensure_future(lanes.call(pack("BLPOP", "q", "30"))) for _ in range(10)]
        await until(lambda: blocked_lanes(watcher) == 3, "3 blocked calls")
        await wait_for_lanes(watcher, 3)
        watcher.rpush("q", *range(10))
        replies = await asyncio.gather(*calls)
        assert sorted(int(value) for _, value in replies) == list(range(10))
        assert lanes.idle == 3
        await wait_for_lanes(watcher, 3)
    assert Lanes(redis.asyncio.Redis.from_url(redis_server.url)).max_lanes == 64


async def test_a_call_waiting_for_a_lane_when_the_lanes_close_says_so(
    redis_server: RedisServer,
) -> None:
    async with lanes_to(f"{redis_server.url}?max_connections=1") as (lanes, watcher):
        holding = asyncio.ensure_future(lanes.call(pack("BLPOP", "held", "30")))
        await until(lambda: blocked_lanes(watcher) == 1, "the lane to be taken")
        waiting = asyncio.ensure_future(lanes.call(pack("ECHO", "too late")))
        await lanes.close()
        watcher.rpush("held", "x")
        assert await holding == [b"held", b"x"]
        with pytest.raises(BackendError, match="closed"):
            await waiting
        await wait_for_lanes(watcher, 0)  # the lane that held went when its call ended


async def test_lanes_left_idle_after_a_burst_are_closed(redis_server: RedisServer) -> None:
    now = [1000.0]
    async with lanes_to(redis_server.url, idle_seconds=60, clock=lambda: now[0]) as (
        lanes,
        watcher,
    ):
        await asyncio.gather(*(lanes.call(pack("ECHO", str(n))) for n in range(5)))
        assert lanes.idle == 5
        await wait_for_lanes(watcher, 5)
        now[0] += 59
        assert await lanes.call(pack("ECHO", "a minute")) == b"a minute"
        assert lanes.idle == 5  # none idle for a minute yet
        now[0] += 2  # the four the last call did not take have been idle 61 s
        assert await lanes.call(pack("ECHO", "later")) == b"later"
        assert lanes.idle == 1
        await wait_for_lanes(watcher, 1)


async def test_a_cancelled_call_never_leaves_its_reply_to_the_next(
    redis_server: RedisServer,
) -> None:
    """A call cancelled while its reply is due drops its connection: had the connection gone
    back to the lanes, the next call would read the late reply as its own."""
    async with lanes_to(redis_server.url) as (lanes, watcher):
        waiting = asyncio.ensure_future(lanes.call(pack("BLPOP", "lanes-test", "5")))
        await until(lambda: blocked_lanes(watcher) == 1, "the call to block")
        waiting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiting
        watcher.rpush("lanes-test", "late")  # the reply the cancelled call would have had
        assert await lanes.call(pack("ECHO", "mine")) == b"mine"
        assert await lanes.call(pack("INCRBY", "n", 2)) == 2
        with pytest.raises(redis.ResponseError):
            await lanes.call(pack("INCRBY", "n", "two"))
        assert await lanes.call(pack("GET", "n")) == b"2"  # an error reply keeps the lane


async def test_a_waiting_row_goes_when_its_last_element_moves_away(
    redis_server: RedisServer,
) -> None:
    """A full group's row waits for a slot; moving its last ready element to later, or into
    another group, must take the row away (a schedule only looks at an active row's head)."""
    clock = ManualClock()
    backend = open_backend(f"{redis_server.url}?namespace=waiting-row", clock=clock)
    await backend.open()
    try:
        await backend.ensure_queues([config("pages")])
        await backend.set_limits([LimitRule(pattern="*.test", limit=Limit(concurrency=1))])
        await schedule(backend, "pages", [url("a.test", 1), url("a.test", 2), url("b.test", 1)])
        running = await claim(backend, "pages")
        assert {c.group for c in running} == {"a.test", "b.test"}
        assert (await schedule(backend, "pages", [url("a.test", 2)], seconds=60)).moved == 1
        assert await backend.check() == []
        await backend.ack(running)
        clock.advance(61)
        (later,) = await claim(backend, "pages")
        assert json.loads(later.payload) == url("a.test", 2)
        assert await backend.check() == []
    finally:
        await backend.close()


async def test_a_closed_backend_says_so(redis_server: RedisServer) -> None:
    backend = open_backend(f"{redis_server.url}?namespace=closed")
    with pytest.raises(BackendError, match="is not open"):
        await claim(backend, "pages")
    await backend.open()
    await backend.ensure_queues([config("pages")])
    await backend.close()
    with pytest.raises(BackendError, match="is not open"):
        await schedule(backend, "pages", [url("a.test", 1)])


async def test_record_buckets_grow_with_the_queue(redis_server: RedisServer) -> None:
    """Linear hashing (lua/common.lua, `grow`): about 32 records a bucket at every size, each
    bucket a listpack, every record in the bucket its state says, every element found."""
    backend = open_backend(f"{redis_server.url}?namespace=growing")
    await backend.open()
    client = redis.Redis.from_url(redis_server.url)
    keys = [url(f"h{n % 50}.test", n) for n in range(3_000)]
    try:
        await backend.ensure_queues([config("pages")])
        for start in range(0, len(keys), 300):  # the state is read back by every call
            await schedule(backend, "pages", keys[start : start + 300])
            held = start + 300
            buckets: list[Any] = list(client.scan_iter(match="{growing}:q:5:pages:e:*"))
            assert held / 32 <= len(buckets) <= held / 32 + 1
        encodings = {client.object("encoding", name) for name in buckets}
        assert encodings == {b"listpack"}
        assert await backend.check() == []
        for key in keys[::97]:
            found = await backend.element("pages", json.dumps(key))
            assert found is not None and found.payload == json.dumps(key)
        claimed = await claim(backend, "pages", limit=1_000)
        await backend.ack(claimed)
        assert await backend.check() == []
    finally:
        client.close()
        await backend.close()


def _woken_queues(pubsub: Any, client: Any, namespace: str) -> list[str]:
    """The queues woken since the last call: every message up to a marker published now
    (Redis delivers one connection's messages in order)."""
    client.publish(f"{{{namespace}}}:wake:<marker>", "1")
    woken: list[str] = []
    deadline = time.monotonic() + 10
    while True:
        assert time.monotonic() < deadline, "the marker never came"
        message = pubsub.get_message(timeout=1)
        if message is None or message["type"] != "pmessage":
            continue  # the subscription's confirmation
        queue = message["channel"].decode().partition(":wake:")[2]
        if queue == "<marker>":
            return woken
        woken.append(queue)


async def test_only_the_workers_of_queues_with_new_work_are_woken(
    redis_server: RedisServer,
) -> None:
    """Per-queue channels: a schedule wakes its queue's workers only, and a slot freed in
    one queue wakes the other queue waiting on the same group."""
    backend = open_backend(f"{redis_server.url}?namespace=per-queue-wake")
    await backend.open()
    client = redis.Redis.from_url(redis_server.url)
    pubsub = client.pubsub()  # type: ignore[no-untyped-call]
    pubsub.psubscribe("{per-queue-wake}:wake:*")
    listener = await backend.listen(["pages"])
    try:
        await backend.ensure_queues([config("pages"), config("login")])
        await backend.set_limits([LimitRule(pattern="one.test", limit=Limit(concurrency=1))])
        assert _woken_queues(pubsub, client, "per-queue-wake") == []
        await schedule(backend, "login", [url("one.test", "login")])
        assert _woken_queues(pubsub, client, "per-queue-wake") == ["login"]
        assert not listener.event.is_set()
        await schedule(backend, "pages", [url("one.test", 1)])
        assert _woken_queues(pubsub, client, "per-queue-wake") == ["pages"]
        await asyncio.wait_for(listener.event.wait(), 10)
        (running,) = await claim(backend, "login")
        assert await claim(backend, "pages") == []  # the group's one slot is taken
        assert _woken_queues(pubsub, client, "per-queue-wake") == []
        await backend.ack([running])
        assert _woken_queues(pubsub, client, "per-queue-wake") == ["pages"]
    finally:
        await listener.close()
        pubsub.close()
        client.close()
        await backend.close()


async def test_rules_stored_before_they_had_an_origin_are_the_apps(
    redis_server: RedisServer,
) -> None:
    async with in_namespace(redis_server, "origins") as (backend, client):
        # As crawlq stored an exact rule before origins: {lua pattern, a, b, concurrency, interval}
        client.hset("{origins}:lx", "slow.test", msgpack.packb(["^slow%.test$", 9, 0, 1, 2.0]))
        await assert_a_rule_of_old_is_the_apps(backend, "slow.test")
        # Rules keep that layout, so an older crawlq sharing the namespace still reads them.
        await backend.set_limits(
            [
                LimitRule(pattern="*.test", limit=Limit(concurrency=2), origin="operator"),
            ]
        )
        records = {**client.hgetall("{origins}:limits"), **client.hgetall("{origins}:lx")}
        assert {len(msgpack.unpackb(raw)) for raw in records.values()} == {5}
        assert {(r.pattern, r.origin) for r in await backend.limits()} == {
            ("*", "app"),
            ("*.test", "operator"),
            ("slow.test", "operator"),
        }


async def test_crawl_delay_rules_an_older_crawlq_stored_become_crawl_delays(
    redis_server: RedisServer,
) -> None:
    """An older crawlq kept a Crawl-delay as an exact rule noted "crawl", which outranked every
    glob. Opened by this one, the namespace holds it as a Crawl-delay instead."""
    async with in_namespace(redis_server, "delays") as (backend, client):
        await backend.ensure_queues(QUEUES)
        await schedule(backend, "pages", [url("c.test", 1)])
        client.hset("{delays}:lx", "c.test", msgpack.packb(["^c%.test$", 6, 0, 4, 3.0]))
        client.hset("{delays}:lo", "c.test", "crawl")
        escaped = msgpack.packb([lua_pattern("a[*]b.test"), 8, -2, 4, 5.0])  # glob_escape'd
        client.hset("{delays}:limits", "a[*]b.test", escaped)
        client.hset("{delays}:lo", "a[*]b.test", "crawl")
        await backend.set_limits([LimitRule(pattern="*.test", limit=Limit(concurrency=2))])
        (before,) = await backend.group_stats("c.test")
        async with in_namespace(redis_server, "delays") as (reopened, _):
            assert await reopened.crawl_delays() == {"a*b.test": 5.0, "c.test": 3.0}
            assert {r.pattern for r in await reopened.limits()} == {"*", "*.test"}
            (after,) = await reopened.group_stats("c.test")
    assert before.limit == Limit(concurrency=4, interval=3.0)  # the old rule outranked the glob
    assert after.limit == Limit(concurrency=2, interval=3.0)


async def test_a_group_left_with_nothing_is_forgotten_once_nothing_of_it_needs_keeping(
    redis_server: RedisServer,
) -> None:
    """A broad crawl meets millions of hosts, most of them once: what Redis keeps of a host's
    group (its hash, number and send reservation, ~280 bytes) goes once its block is past,
    and its interval, at least RETIRE_AFTER (60 s), since its last start and its last send
    reservation. The group comes back resolved afresh with work."""
    clock = ManualClock()
    backend = open_backend(f"{redis_server.url}?namespace=retired", clock=clock)
    await backend.open()
    client: Any = redis.Redis.from_url(redis_server.url)

    def kept() -> set[str]:
        return {name.decode() for name in client.hvals("{retired}:gn")}

    def sent() -> set[str]:
        return {name.decode() for name in client.hkeys("{retired}:sent")}

    async def run_one(host: str) -> None:  # in a queue of its own: only `host` is claimed
        await schedule(backend, "logins", [url(host)])
        await backend.ack(await claim(backend, "logins"))

    try:
        await backend.ensure_queues([config("pages"), config("logins")])
        slow = LimitRule(pattern="slow.test", limit=Limit(concurrency=1, interval=10))
        await backend.set_limits([slow])
        hosts = ("fast.test", "slow.test", "paused.test")
        await schedule(backend, "pages", [url(host) for host in hosts])
        running = await claim(backend)
        await backend.reserve_send_slot("slow.test", 10.0, 5.0)  # a request paced ahead
        await backend.reserve_send_slot("cdn.test", 2.0)  # a host with no element
        await backend.block_group("paused.test", clock() + 120, "429 Retry-After 120")
        await backend.block_group("hop.test", clock() + 5, "429")  # no element either
        await backend.ack(running)
        assert kept() == {"fast.test", "slow.test", "paused.test", "hop.test"}
        assert sent() == {"slow.test", "cdn.test"}

        clock.advance(60.5)
        await run_one("other.test")
        assert kept() == {"slow.test", "paused.test", "other.test"}  # slow.test: its send
        assert sent() == {"slow.test"}
        clock.advance(6)
        await run_one("other.test")
        assert kept() == {"paused.test", "other.test"}
        assert sent() == set()
        assert await backend.group_stats("slow.test", include_idle=True) == []

        await schedule(backend, "pages", [url("paused.test", 2)])  # work again, still paused
        clock.advance(60)
        await run_one("another.test")
        assert "paused.test" in kept()  # it has work: kept
        await run_one("slow.test")  # back, with its rule
        (group,) = await backend.group_stats("slow.test", include_idle=True)
        assert group.limit == slow.limit
        await backend.ack(await claim(backend))  # paused.test's page
        clock.advance(61)
        await run_one("another.test")
        assert kept() == {"another.test"}
        assert await backend.check() == []
    finally:
        client.close()
        await backend.close()


async def test_an_interval_raised_after_a_group_emptied_counts_from_its_last_start(
    redis_server: RedisServer,
) -> None:
    """As on SQLite: a Crawl-delay or a rule raised after a host's last page was done still
    spaces its next page from that page's start, though the group had nothing left."""
    clock = ManualClock()
    backend = open_backend(f"{redis_server.url}?namespace=raised", clock=clock)
    await backend.open()
    try:
        await backend.ensure_queues([config("pages")])
        await schedule(backend, "pages", [url("h.test", 1)])
        await backend.ack(await claim(backend))
        clock.advance(5)
        await backend.raise_crawl_delays({"h.test": 30.0})
        await schedule(backend, "pages", [url("h.test", 2)])
        assert await claim(backend) == []
        clock.advance(25)
        assert len(await claim(backend)) == 1
    finally:
        await backend.close()


async def test_opening_without_create_refuses_an_empty_namespace(
    redis_server: RedisServer,
) -> None:
    with pytest.raises(BackendUnavailable, match="no crawlq data"):
        await open_backend(f"{redis_server.url}?namespace=never-made", create=False).open()
    client = redis.Redis.from_url(redis_server.url)
    assert client.keys("{never-made}*") == []
    client.close()


async def test_a_namespace_of_another_layout_is_refused_untouched(
    redis_server: RedisServer,
) -> None:
    client = redis.Redis.from_url(redis_server.url)
    client.set("{older}:version", "1")
    client.hset("{older}:q:5:pages:e", "x" * 8, "a record of layout 1")
    with pytest.raises(BackendError, match="layout 1; this crawlq reads layout 7"):
        await open_backend(f"{redis_server.url}?namespace=older").open()
    stored: Any = client.hget("{older}:q:5:pages:e", "x" * 8)  # typed "awaitable or value"
    assert stored == b"a record of layout 1"
    client.close()


async def test_unicode_keys_keep_their_group_name_through_storage(
    redis_server: RedisServer,
) -> None:
    """Records store a key without its group's name (lua/common.lua, `encode`), cut by byte
    position, and a URL without its scheme too: keys and groups with multi-byte characters,
    URLs with nothing after the host or quotes in them, come back whole."""
    backend = open_backend(f"{redis_server.url}?namespace=unicode")
    await backend.open()
    client = redis.Redis.from_url(redis_server.url)
    try:
        await backend.ensure_queues([config("pages")])
        urls = [
            "http://ü@xn--bcher-kva.test/p/ü",
            "http://xn--bcher-kva.test/bücher",
            "http://ü/",
            "https://a.test",
            'https://b.test/say?"hi"',
            "HTTPS://C.TEST/upper",  # the group is c.test: the key keeps its host
        ]
        await schedule(backend, "pages", urls)
        sync: Any = client  # redis-py types its commands "awaitable or value"
        stored = b"".join(
            value
            for bucket in sync.scan_iter(match="{unicode}:q:5:pages:e:*")
            for value in sync.hvals(bucket)
        )
        assert b"https://" not in stored and b"b.test" not in stored and b"C.TEST" in stored
        elements = await claim(backend, "pages", limit=10)
        assert sorted(json.loads(p) for p in payloads(elements)) == sorted(urls)
        for element in elements:
            info = await backend.element("pages", element.key)
            assert info is not None and info.key == element.key
        odd = "p*ges[1]?\\^"  # glob characters: the checker must find its records all the same
        await backend.ensure_queues([config(odd)])
        await schedule(backend, odd, urls)
        await claim(backend, odd, limit=1)
        assert await backend.check() == []
    finally:
        client.close()
        await backend.close()


async def test_due_times_microseconds_apart_order_by_due(redis_server: RedisServer) -> None:
    """Ranks hold due times in whole microseconds (lua/common.lua, `rank`): two elements due
    2 us apart come out by due time, not by insertion."""
    clock = ManualClock()
    backend = open_backend(f"{redis_server.url}?namespace=microseconds", clock=clock)
    await backend.open()
    try:
        await backend.ensure_queues([config("jobs")])
        await schedule(backend, "jobs", ["later"], seconds=-0.000001)
        await schedule(backend, "jobs", ["sooner"], seconds=-0.000003)
        await schedule(backend, "jobs", ["last"], seconds=-0.000001)
        assert payloads(await claim(backend, "jobs")) == ['"sooner"', '"later"', '"last"']
    finally:
        await backend.close()


async def test_priorities_order_exactly_within_53_bits(redis_server: RedisServer) -> None:
    backend = open_backend(f"{redis_server.url}?namespace=priorities")
    await backend.open()
    try:
        await backend.ensure_queues([config("jobs")])
        for p in (2**52, -(2**52), 2**52 - 1, 0):
            await schedule(backend, "jobs", [p], priority=p)
        assert [c.priority for c in await claim(backend, "jobs")] == [
            2**52,
            2**52 - 1,
            0,
            -(2**52),
        ]
    finally:
        await backend.close()


async def test_limit_rules_match_in_lua_as_fnmatch_does(redis_server: RedisServer) -> None:
    """Random globs over a small alphabet, set as limit rules: each group's limit in Redis is
    the one Python's fnmatch-based resolution gives."""
    from crawlq.limits import resolve

    rng = random.Random(11)
    alphabet = "ab.-*?[]!%^$"
    globs = {"".join(rng.choice(alphabet) for _ in range(rng.randrange(1, 6))) for _ in range(60)}
    rules = [
        LimitRule(pattern=glob, limit=Limit(concurrency=i + 1))
        for i, glob in enumerate(sorted(globs))
    ]
    groups = sorted(
        {"".join(rng.choice("ab.-%^$[]") for _ in range(rng.randrange(1, 5))) for _ in range(80)}
    )
    backend = open_backend(f"{redis_server.url}?namespace=globs")
    await backend.open()
    try:
        await backend.set_limits(rules)
        for group in groups:  # makes the group known (a group with nothing is kept while blocked)
            await backend.block_group(group, backend.now() + 3600, None)
        stored = {g.name: g.limit for g in await backend.group_stats(limit=1000, include_idle=True)}
        all_rules = await backend.limits()
        for group in groups:
            assert stored[group] == resolve(group, all_rules), group
        for glob in sorted(globs):
            matched = {
                g.name for g in await backend.group_stats(glob, limit=1000, include_idle=True)
            }
            assert matched == {g for g in groups if fnmatchcase(g, glob)}, glob
    finally:
        await backend.close()


def test_lua_patterns_of_plain_globs() -> None:
    assert lua_pattern("*.example.org") == "^.*%.example%.org$"
    assert lua_pattern("h?.test") == "^h.%.test$"
    assert lua_pattern("[!a-c]x") == "^[^a-c]x$"
    assert lua_pattern("[") == "^%[$"


@pytest.fixture
async def colliding(
    redis_server: RedisServer, monkeypatch: pytest.MonkeyPatch, clock: ManualClock
) -> AsyncIterator[Backend]:
    """A Redis backend where every key has the same 64-bit digest: each element after the
    first of a queue takes the collision path (field = digest + key)."""
    import crawlq.backends.redis.backend as redis_backend

    monkeypatch.setattr(redis_backend, "key_hash", lambda key: 42)
    backend = open_backend(f"{redis_server.url}?namespace=collide-{id(clock)}", clock=clock)
    await backend.open()
    await backend.ensure_queues(QUEUES)
    try:
        yield backend
    finally:
        await backend.close()


async def test_colliding_digests_keep_elements_apart(
    colliding: Backend, clock: ManualClock
) -> None:
    result = await schedule(colliding, "jobs", ["a", "b", "c"])
    assert result.added == 3
    assert (await schedule(colliding, "jobs", ["b"], priority=5)).moved == 1
    first, *rest = await claim(colliding, "jobs")
    assert first.payload == '"b"'
    assert sorted(c.payload for c in rest) == ['"a"', '"c"']
    await colliding.ack([first])
    assert (await schedule(colliding, "jobs", ["b"])).added == 1  # "a" and "c" still hold theirs
    await colliding.fail([Failure(element=rest[0], error="boom")])
    assert [d.payload for d in await colliding.dead_letters("jobs")] == [rest[0].payload]
    assert await colliding.requeue_dead("jobs") == 1
    assert sorted(c.payload for c in await claim(colliding, "jobs")) == sorted(
        ['"b"', rest[0].payload]
    )


async def test_colliding_digests_pass_the_random_model(
    colliding: Backend, clock: ManualClock
) -> None:
    from .test_conformance import test_frontier_matches_a_simple_model_under_random_operations

    await test_frontier_matches_a_simple_model_under_random_operations(colliding, clock)


def remember_for_a_record(client: redis.Redis, q: str, remembered: list[Any]) -> None:
    """Sets NEXT_DUE and what follows it (records.py) to `remembered` in every record of an
    element not running (every copy: one may be misplaced already)."""
    for bucket in client.scan_iter(match=q + "e:*"):
        fields: Any = client.hgetall(bucket)  # redis-py types it "awaitable or value"
        for field, raw in fields.items():
            rec = records.unpack(raw)
            if rec[records.STATE] != 2:  # not running
                rec[records.NEXT_DUE :] = remembered
                client.hset(bucket, field, msgpack.packb(rec))


def misplace_a_record(client: redis.Redis, q: str) -> None:
    """Copies a record into a bucket that its field does not pick."""
    bucket = next(iter(client.scan_iter(match=q + "e:*")))
    fields: Any = client.hgetall(bucket)  # redis-py types it "awaitable or value"
    field, raw = next(iter(fields.items()))
    other = q + ("e:1" if bucket.endswith(b":e:0") else "e:0")
    client.hset(other, field, raw)


async def test_the_checker_finds_each_kind_of_damage(redis_server: RedisServer) -> None:
    """`check()` is what the other tests trust (conftest runs it after every Redis test), so
    it must see damage: each corruption below is reported."""
    from crawlq.backends.redis import RedisBackend

    backend = open_backend(f"{redis_server.url}?namespace=damage")
    assert isinstance(backend, RedisBackend)
    await backend.open()
    client = redis.Redis.from_url(redis_server.url)
    try:
        await fill_for_damage(backend)
        q = "{damage}:q:5:pages:"
        damages: list[tuple[Callable[[], object], str]] = [
            (lambda: client.hincrby(q + "n", "1", 1), "count of state 1"),
            (lambda: client.zadd(q + "d", {b"x" * 8: 1}), "delayed set"),
            (lambda: client.zpopmax(q + "r:a.test"), "sub-queue"),
            (lambda: client.delete("{damage}:leases"), "lease"),
            (lambda: client.hincrby("{damage}:g:a.test", "r", 1), "group a.test"),
            (lambda: client.hincrby("{damage}:g:b.test", "w", 1), "waiting rows"),
            (lambda: client.delete(q + "fr"), "frontier row"),
            (lambda: client.hdel("{damage}:g:b.test", "id"), "group b.test: number"),
            (lambda: client.hset("{damage}:gn", "999", "c.test"), "group numbers for"),
            (lambda: misplace_a_record(client, q), "is in bucket"),
            (lambda: remember_for_a_record(client, q, [False] * 4 + ["1"]), "incomplete"),
            (lambda: remember_for_a_record(client, q, [1, 0, False, False]), "not running"),
        ]
        for damage, expected in damages:
            damage()
            problems = await backend.check()
            assert any(expected in p for p in problems), (expected, problems)
    finally:
        client.close()
        await backend.close()


async def test_big_batches_go_in_calls_of_a_bounded_size(
    redis_server: RedisServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A Lua function holds the whole server: one of 200,000 elements kept every other client
    waiting 8.5 s. With calls of 3 here: a schedule of 10 elements, a claim of 10 and a
    requeue of every dead letter each take several calls, and give what one call gave."""
    from crawlq.backends.redis import backend as redis_backend

    monkeypatch.setattr(redis_backend, "CALL_ITEMS", 3)
    client = redis.Redis.from_url(redis_server.url.partition("?")[0])
    backend = open_backend(f"{redis_server.url}?namespace=chunks", clock=ManualClock())
    await backend.open()

    def calls() -> int:
        stats: Any = client.info("commandstats")
        return int(stats.get("cmdstat_fcall", {}).get("calls", 0))

    try:
        await backend.ensure_queues([config("jobs")])
        before = calls()
        elements = [f"e{n}" for n in range(10)]
        result = await schedule(backend, "jobs", elements)
        assert result.added == 10 and calls() - before == 4
        first = await backend.claim(["jobs"], worker="w", limit=10, lease=60)
        assert len(first.elements) == 3
        claimed = first.elements + await claim(backend, "jobs", limit=10)
        claimed += await claim(backend, "jobs", limit=10)
        claimed += await claim(backend, "jobs", limit=10)
        assert sorted(json.loads(c.payload) for c in claimed) == elements
        await backend.fail([Failure(element=c, error="gone") for c in claimed])
        before = calls()
        assert await backend.requeue_dead("jobs") == 10 and calls() - before == 4
        assert await backend.dead_letters("jobs", limit=0) == []
        with pytest.raises(UnknownQueue):
            await schedule(backend, "nope", [url("a.test", n) for n in range(10)])
        assert await backend.check() == []
    finally:
        await backend.close()
        client.close()


async def test_a_batch_with_a_bad_item_is_refused_before_anything_is_written(
    redis_server: RedisServer,
) -> None:
    """A Lua error undoes nothing: the good element before a priority of None was stored
    with no frontier row, never claimable, and the counts were off."""
    from crawlq.tasks import prepare

    backend = open_backend(f"{redis_server.url}?namespace=bad-batch", clock=ManualClock())
    await backend.open()
    try:
        await backend.ensure_queues([config("pages")])
        good = prepare(config("pages"), url("a.test", 1), due=backend.now())
        bad = prepare(config("pages"), url("a.test", 2), due=backend.now())
        object.__setattr__(bad, "priority", None)
        with pytest.raises(ConfigError, match="priority"):
            await backend.schedule([good, bad])
        object.__setattr__(bad, "priority", 0)
        object.__setattr__(bad, "due", float("nan"))
        with pytest.raises(ConfigError, match="due"):
            await backend.schedule([good, bad])
        (stats,) = await backend.queue_stats()
        assert stats.total == 0 and await backend.check() == []
    finally:
        await backend.close()


def test_ranges_with_lua_magic_ends_match_as_fnmatch_does(redis_server: RedisServer) -> None:
    """Escaped, the ends of [%-^] made no range in Lua: '0[' matched the glob '[%-^][' in
    fnmatch but not in Redis."""
    client = redis.Redis.from_url(redis_server.url.partition("?")[0])
    rng = random.Random(5)
    magic = "^$()%.[]*+-?!"
    cases = []
    for _ in range(400):
        low, high = sorted(rng.choice(magic + "a0Z") for _ in range(2))
        glob = f"[{low}-{high}]" + rng.choice(["", "*", "?", "["])
        for _ in range(5):
            subject = "".join(rng.choice(magic + "a0Z@") for _ in range(rng.randrange(1, 3)))
            cases.append((glob, subject))
    try:
        for glob, subject in cases:
            found = client.eval(
                "return string.find(ARGV[1], ARGV[2]) and 1 or 0", 0, subject, lua_pattern(glob)
            )
            assert bool(found) == fnmatchcase(subject, glob), (glob, subject)
    finally:
        client.close()


async def test_a_remembered_payload_is_stored_only_when_it_differs(
    redis_server: RedisServer,
) -> None:
    """NEXT_PAYLOAD, last in a record (lua/common.lua, REC): absent unless a schedule that
    came while the element ran has a payload of its own; a record stored before it existed
    has none, and runs again with the payload it had, as it did then."""
    keyed = QueueConfig(name="keyed", group_by=GroupBy.NONE, custom_key=True)

    def item(element: JSON, priority: int = 0) -> Schedule:
        return prepare(keyed, element, due=0, priority=priority, key=lambda e: "k")

    async with in_namespace(redis_server, "next-payload") as (backend, client):

        def stored() -> tuple[bytes, bytes, list[Any]]:
            (bucket,) = client.scan_iter(match="{next-payload}:q:5:keyed:e:*")
            ((field, raw),) = client.hgetall(bucket).items()
            return bucket, field, msgpack.unpackb(raw, raw=False)

        await backend.ensure_queues([keyed])
        await backend.schedule([item({"v": 1})])
        (running,) = await claim(backend, "keyed")
        await backend.schedule([item({"v": 2}, priority=3)])
        assert stored()[2][records.NEXT_PAYLOAD :] == ['{"v":2}']
        await backend.schedule([item({"v": 1}, priority=3)])  # the running payload: none kept
        assert len(stored()[2]) == records.NEXT_PAYLOAD
        await backend.schedule([item({"v": 2}, priority=3)])
        bucket, field, rec = stored()
        client.hset(bucket, field, msgpack.packb(rec[: records.NEXT_PAYLOAD]))  # of old
        await backend.ack([running])
        (again,) = await claim(backend, "keyed")
        assert (again.payload, again.priority) == ('{"v":1}', 3)
        assert len(stored()[2]) == records.NEXT_PAYLOAD
        assert await backend.check() == []
