"""The Redis backend's connections as an operator meets them: restarts of redis-server under
a listening worker, permissions an ACL leaves out. Real servers throughout."""

from __future__ import annotations

import asyncio
import signal
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from crawlq.backends.redis import backend as backend_module
from crawlq.backends.redis import lanes
from crawlq.backends.redis.backend import RedisBackend
from crawlq.errors import BackendError, BackendUnavailable
from crawlq.testing.redis_server import RedisServer
from crawlq.types import QueueConfig, Schedule

from .test_worker_processes import finish, make_env, wait_for


@pytest.fixture
def server() -> Iterator[RedisServer]:
    server = RedisServer(appendonly=True, appendfsync="always")
    server.start()
    try:
        yield server
    finally:
        server.remove()


def clients(admin: redis.Redis) -> list[dict[str, Any]]:
    listed: Any = admin.client_list()  # redis-py types it "awaitable or value"
    return list(listed)


def element(key: str, group: str = "g") -> Schedule:
    return Schedule(queue="q", key=key, payload=None, group=group, due=time.time())


@pytest.mark.parametrize("down", [0.0, 1.0])
async def test_an_idle_worker_claims_again_once_redis_is_back(
    server: RedisServer, down: float
) -> None:
    """Whatever was published while the wake-up listener was not subscribed is lost: once
    subscribed again it sets its event, so the worker claims again at once. Before, redis-py
    reconnected and subscribed again without a word, and an element scheduled just after the
    restart waited for the worker's 30 s idle timeout."""
    backend = RedisBackend(server.url)
    await backend.open()
    try:
        await backend.ensure_queues([QueueConfig(name="q")])
        listener = await backend.listen(["q"])
        listener.event.clear()
        server.stop()
        await asyncio.sleep(down)  # how long Redis is down: the scenario, not a wait
        server.start()
        async with asyncio.timeout(15):
            await listener.event.wait()  # set by subscribing again, with nothing published
        listener.event.clear()
        await backend.schedule([element("after")])  # and new work still wakes it
        async with asyncio.timeout(15):
            await listener.event.wait()
        await listener.close()
    finally:
        await backend.close()


async def test_a_server_that_stops_answering_is_reported_and_used_again_once_it_answers(
    server: RedisServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A stopped redis-server (SIGSTOP: its socket open, the kernel acknowledging) never
    answers, and TCP keepalive cannot tell: operations and plain commands alike waited for
    ever. Each now gives up after lanes.CALL_TIMEOUT with an error that says so, and the
    backend works again once the server does."""
    monkeypatch.setattr(lanes, "CALL_TIMEOUT", 1.0)
    monkeypatch.setattr(backend_module, "RECONNECT_PATIENCE", 1.0)  # no second try
    backend = RedisBackend(server.url)
    await backend.open()
    try:
        await backend.ensure_queues([QueueConfig(name="q")])
        await backend.schedule([element("before")])
        server.pause()
        try:
            for call in (
                lambda: backend.schedule([element("stopped")]),  # an operation (lanes)
                backend.queues,  # a plain command (redis-py's pool)
                lambda: backend.listen(["q"]),  # subscribing (a worker starting)
            ):
                async with asyncio.timeout(30):
                    with pytest.raises(BackendUnavailable, match="no reply from Redis in 1 s"):
                        await call()
        finally:
            server.resume()
        async with asyncio.timeout(30):
            await backend.schedule([element("after")])
            assert [c.name for c in await backend.queues()] == ["q"]
            (stats,) = await backend.queue_stats()
        # The schedule that timed out may have run once the server continued: never twice.
        assert stats.total in (2, 3)
    finally:
        await backend.close()


async def test_an_acl_user_without_the_wake_up_channels_gets_a_clear_error() -> None:
    """A user whose ACL leaves out the `{ns}:wake:*` channels: a worker starting got redis-py's
    NoPermissionError (a traceback); now a BackendError naming the channels, no password."""
    server = RedisServer(password="s3cret-pw")
    server.start()
    try:
        admin = redis.Redis.from_url(server.url)
        admin.execute_command(  # type: ignore[no-untyped-call]
            "ACL", "SETUSER", "crawler", "on", ">crawler-pw", "~*", "resetchannels", "+@all"
        )
        admin.close()
        backend = RedisBackend(f"redis://crawler:crawler-pw@127.0.0.1:{server.port}/0")
        await backend.open()
        try:
            with pytest.raises(BackendError, match=r"refused the wake-up channels") as refused:
                await backend.listen(["q"])
            assert "crawler-pw" not in str(refused.value)
        finally:
            await backend.close()
    finally:
        server.remove()


async def test_a_full_redis_refuses_whole_calls_and_stats_still_read(server: RedisServer) -> None:
    """At `maxmemory` (noeviction) Redis refuses every operation before it runs: nothing is
    half-written, the error says what to do, and `crawlq stats` still reads (it used MULTI,
    which a full Redis refuses even for reads)."""
    backend = RedisBackend(server.url)
    await backend.open()
    admin = redis.Redis.from_url(server.url)
    try:
        await backend.ensure_queues([QueueConfig(name="q")])
        await backend.schedule([element(f"before-{n}", f"g{n}") for n in range(10)])
        admin.config_set("maxmemory", 1)  # far below what is used: every write is refused
        with pytest.raises(BackendError, match=r"failed in schedule: .*maxmemory.*Redis is full"):
            await backend.schedule([element(f"full-{n}") for n in range(10)])
        with pytest.raises(BackendError, match=r"failed in claim: .*Redis is full"):
            await backend.claim(["q"], worker="w", limit=1, lease=60.0)
        (stats,) = await backend.queue_stats()
        assert stats.total == 10
        admin.config_set("maxmemory", 0)
        claimed = await backend.claim(["q"], worker="w", limit=10, lease=60.0)
        assert len(claimed.elements) == 10
        assert await backend.check() == []
    finally:
        admin.config_set("maxmemory", 0)
        admin.close()
        await backend.close()


async def test_a_read_only_replica_is_reported_as_such(server: RedisServer) -> None:
    replica = RedisServer()
    replica.start()
    try:
        admin = redis.Redis.from_url(replica.url)
        admin.execute_command("REPLICAOF", "127.0.0.1", str(server.port))  # type: ignore[no-untyped-call]
        admin.close()
        with pytest.raises(
            BackendUnavailable, match=r"cannot use Redis at .*point crawlq at the primary"
        ):
            await RedisBackend(replica.url).open()
    finally:
        replica.remove()


async def test_a_schedule_that_meets_redis_back_without_its_data_says_so() -> None:
    """A restart without persistence loses the queues: a schedule (a `crawlq schedule` bulk
    in flight) then failed with "unknown queue", as if the caller had misspelt it."""
    server = RedisServer()  # no appendonly
    server.start()
    try:
        backend = RedisBackend(server.url)
        await backend.open()
        try:
            await backend.ensure_queues([QueueConfig(name="q")])
            server.restart()
            with pytest.raises(BackendError, match=r"restarted during this schedule.*'q'"):
                await backend.schedule([element(f"k{n}") for n in range(3)])
            await backend.ensure_queues([QueueConfig(name="q")])  # as a worker does
            assert (await backend.schedule([element("again")])).added == 1
        finally:
            await backend.close()
    finally:
        server.remove()


def test_a_worker_idle_through_a_restart_runs_work_scheduled_just_after(
    server: RedisServer, tmp_path: Path
) -> None:
    """End to end: a worker process idle (nothing queued: it sleeps up to 30 s) while Redis
    restarts; an element scheduled as soon as Redis is back runs within seconds. Before,
    its wake-up was usually published before the worker's listener was back, and it waited out
    the idle timeout: 29.8 s in 3 runs of 4 (the listener test above fails every time)."""
    env = make_env(f"{server.url}?namespace=idle-restart", tmp_path)
    app = env.app()
    with app:
        app.schedule_many("hold", [{"on": [], "n": 0}])
    worker = env.worker("-c", "2")
    admin = redis.Redis.from_url(server.url)
    try:
        wait_for(lambda: len(env.events()) >= 2, what="the first element to run")
        server.restart(kill=True)
        channel = "{idle-restart}:wake:hold"
        with app:
            app.schedule_many("hold", [{"on": [], "n": 1}])
        started = time.monotonic()
        wait_for(
            lambda: any(e["element"]["n"] == 1 for e in env.events() if e["event"] == "end"),
            timeout=15,
            what="the element scheduled after the restart to run",
        )
        assert time.monotonic() - started < 15
        # The element may run before the listener is back: a listener that redis-py gave up
        # on wakes the worker at once, then subscribes again after its pause.
        wait_for(
            lambda: admin.pubsub_numsub(channel)[0][1] == 1,  # type: ignore[index]
            timeout=15,
            what="the worker's listener to subscribe again",
        )
    finally:
        admin.close()
        worker.send_signal(signal.SIGTERM)
        output = finish(worker)
    assert worker.returncode == 0, output


async def test_tls_and_plain_text_mixed_up_are_named_as_such() -> None:
    """redis:// to a TLS port said "Connection reset by peer", rediss:// to a plain one
    "Timeout connecting to server": now each also says which scheme the port may need."""
    tls, plain = RedisServer(tls=True), RedisServer()
    tls.start()
    plain.start()
    try:
        with pytest.raises(BackendUnavailable, match=r"a TLS port\? use rediss://"):
            await RedisBackend(f"redis://127.0.0.1:{tls.port}/0").open()
        with pytest.raises(BackendUnavailable, match=r"a plain-text port\? rediss:// speaks TLS"):
            await RedisBackend(f"rediss://127.0.0.1:{plain.port}/0").open()
    finally:
        tls.remove()
        plain.remove()


async def test_an_acl_user_without_fcall_is_refused_on_opening_and_left_connected_nowhere() -> None:
    server = RedisServer(password="s3cret-pw")
    server.start()
    try:
        seeded = RedisBackend(f"{server.url}?namespace=n")
        await seeded.open()  # a namespace with data: opening it runs one operation
        await seeded.close()
        admin = redis.Redis.from_url(server.url)
        admin.execute_command(  # type: ignore[no-untyped-call]
            "ACL", "SETUSER", "crawler", "on", ">crawler-pw", "~*", "&*", "+@all", "-fcall"
        )
        backend = RedisBackend(f"redis://crawler:crawler-pw@127.0.0.1:{server.port}/0?namespace=n")
        with pytest.raises(BackendError, match=r"no permissions to run the 'fcall' command") as e:
            await backend.open()
        assert "crawler-pw" not in str(e.value)
        deadline = time.monotonic() + 10
        while any(c.get("user") == "crawler" for c in clients(admin)):
            assert time.monotonic() < deadline, "the refused backend's connections stay open"
            await asyncio.sleep(0.02)
        admin.close()
    finally:
        server.remove()


async def test_queues_stored_again_after_redis_lost_its_data_can_be_inspected() -> None:
    """After a restart without persistence the workers store their queues again; `crawlq
    stats` (which opens without creating) then said "no crawlq data", and the default rule
    was gone from the listed limits."""
    server = RedisServer()  # no appendonly
    server.start()
    try:
        backend = RedisBackend(server.url)
        await backend.open()
        try:
            await backend.ensure_queues([QueueConfig(name="q")])
            server.restart()
            await backend.ensure_queues([QueueConfig(name="q")])  # as a worker does
            await backend.schedule([element("a")])
            inspecting = RedisBackend(server.url, create=False)
            await inspecting.open()
            try:
                (stats,) = await inspecting.queue_stats()
                assert (stats.name, stats.total) == ("q", 1)
                assert [rule.pattern for rule in await inspecting.limits()] == ["*"]
            finally:
                await inspecting.close()
        finally:
            await backend.close()
    finally:
        server.remove()


async def test_listing_a_workers_elements_and_checking_fail_as_clearly_as_any_call() -> None:
    """worker_elements and check read outside the backend's error translation: an ACL
    refusal (or a lost server) came out as redis-py's own exception, a traceback."""
    server = RedisServer(password="s3cret-pw")
    server.start()
    try:
        admin = redis.Redis.from_url(server.url)
        admin.execute_command(  # type: ignore[no-untyped-call]
            "ACL", "SETUSER", "crawler", "on", ">crawler-pw", "~*", "&*", "+@all", "-sscan", "-scan"
        )
        admin.close()
        backend = RedisBackend(f"redis://crawler:crawler-pw@127.0.0.1:{server.port}/0")
        await backend.open()
        try:
            with pytest.raises(BackendError, match=r"no permissions to run the 'sscan'"):
                await backend.worker_elements("w")
            with pytest.raises(BackendError, match=r"no permissions to run the 'scan'"):
                await backend.check()  # `crawlq check`
        finally:
            await backend.close()
    finally:
        server.remove()


async def test_opening_waits_for_a_server_loading_its_data(tmp_path: Path) -> None:
    """A server restarting with much data answers LOADING for a while: a worker started then
    failed at once ("cannot reach Redis ...: Redis is loading the dataset in memory"). It
    now waits for the load, up to OPEN_TIMEOUT."""
    slow = RedisServer(
        appendonly=True,
        appendfsync="always",
        # 300 us a key while loading, and answering (LOADING) between every kilobyte.
        extra_args=("--key-load-delay", "300", "--loading-process-events-interval-bytes", "1024"),
    )
    slow.start()
    try:
        admin = redis.Redis.from_url(slow.url)
        admin.eval("for i = 1, 5000 do redis.call('SET', 'k' .. i, i) end", 0)
        admin.close()
        slow.stop()
        starting = asyncio.create_task(asyncio.to_thread(slow.start))  # returns once loaded
        deadline = time.monotonic() + 10
        while not loading(slow.port):
            assert time.monotonic() < deadline, "the server never said it was loading"
            assert not starting.done(), "loaded before it was seen loading: use more keys"
            await asyncio.sleep(0.01)
        backend = RedisBackend(slow.url)
        await backend.open()
        try:
            await backend.ensure_queues([QueueConfig(name="q")])
        finally:
            await backend.close()
        await starting
    finally:
        slow.remove()


def loading(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1) as sock:
            sock.sendall(b"PING\r\n")
            return sock.recv(64).startswith(b"-LOADING")
    except OSError:
        return False
