"""An ACL user that may FCALL but not FUNCTION LOAD: it works once an admin has loaded this
crawlq's function library, and is told what to do while the library is missing. Before, it
was refused on every opening, the library loaded or not. A real redis-server and a real ACL
user, made with ACL SETUSER."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
import redis

from crawlq.backends.redis.backend import RedisBackend
from crawlq.errors import BackendError, BackendUnavailable
from crawlq.testing.redis_server import RedisServer
from crawlq.types import QueueConfig, Schedule

PASSWORD = "s3cret-pw"
USER_PASSWORD = "crawler-pw"


@pytest.fixture
def server() -> Iterator[RedisServer]:
    server = RedisServer(password=PASSWORD)
    server.start()
    try:
        admin = redis.Redis.from_url(server.url)
        # Every command but the FUNCTION ones (LOAD, LIST, FLUSH...): FCALL stays allowed.
        admin.execute_command(  # type: ignore[no-untyped-call]
            "ACL", "SETUSER", "crawler", "on", f">{USER_PASSWORD}", "~*", "&*", "+@all", "-function"
        )
        admin.close()
        yield server
    finally:
        server.remove()


def user_url(server: RedisServer) -> str:
    return f"redis://crawler:{USER_PASSWORD}@127.0.0.1:{server.port}/0?namespace=n"


def flush_functions(server: RedisServer) -> None:
    admin = redis.Redis.from_url(server.url)
    admin.execute_command("FUNCTION", "FLUSH")  # type: ignore[no-untyped-call]
    admin.close()


async def admin_opens(server: RedisServer) -> None:
    """What `crawlq stats --backend URL` does as an admin: opens without creating."""
    backend = RedisBackend(f"{server.url}?namespace=n", create=False)
    try:
        await backend.open()
    except BackendUnavailable as exc:  # a namespace without data yet: loaded all the same
        assert "no crawlq data" in str(exc)
    else:
        await backend.close()


async def use(url: str) -> None:
    backend = RedisBackend(url)
    await backend.open()
    try:
        await backend.ensure_queues([QueueConfig(name="q")])
        await backend.schedule(
            [Schedule(queue="q", key="k", payload=None, group="g", due=time.time())]
        )
        claimed = await backend.claim(["q"], worker="w", limit=1, lease=60.0)
        assert [c.key for c in claimed.elements] == ["k"]
        await backend.ack(claimed.elements)
    finally:
        await backend.close()


async def test_a_user_without_function_load_works_once_the_library_is_loaded(
    server: RedisServer,
) -> None:
    await admin_opens(server)  # the admin loads the library; the namespace is still empty
    await use(user_url(server))  # a new namespace for the user, then a non-empty one
    await use(user_url(server))


OLDER = "crawlq_0123456789abcdef"  # another crawlq version's library, as the server has it


async def test_a_missing_library_the_user_cannot_load_is_named_with_the_fix(
    server: RedisServer,
) -> None:
    admin = redis.Redis.from_url(server.url)
    admin.function_load(
        f"#!lua name={OLDER}\nredis.register_function('{OLDER}_claim', function() return 0 end)"
    )
    admin.close()
    with pytest.raises(BackendUnavailable) as refused:
        await RedisBackend(user_url(server)).open()
    message = str(refused.value)
    assert message.startswith("cannot use Redis at redis://***@127.0.0.1:"), message
    assert "crawlq function library crawlq_" in message
    assert "is not loaded on the server, and this user may not load it" in message
    assert "FUNCTION LOAD (ACL +function|load)" in message
    assert "crawlq stats --backend URL" in message
    assert USER_PASSWORD not in message and PASSWORD not in message
    await admin_opens(server)
    await use(user_url(server))


async def test_a_library_lost_under_an_open_backend_is_named_with_the_fix(
    server: RedisServer,
) -> None:
    """FUNCTION FLUSH (or a restart without persistence) under an open backend: its next call
    loads the library again, which this user may not do; the error says so."""
    await admin_opens(server)
    backend = RedisBackend(user_url(server))
    await backend.open()
    try:
        await backend.ensure_queues([QueueConfig(name="q")])
        flush_functions(server)
        with pytest.raises(BackendError, match=r"failed in claim: the crawlq function library"):
            await backend.claim(["q"], worker="w", limit=1, lease=60.0)
        await admin_opens(server)
        claimed = await backend.claim(["q"], worker="w", limit=1, lease=60.0)
        assert claimed.elements == []
    finally:
        await backend.close()
