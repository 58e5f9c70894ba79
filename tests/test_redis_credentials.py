"""A Redis that refuses the login (a wrong password, a wrong ACL user or password, no password
given to a server that wants one) says so, with the URL masked; it said "cannot reach Redis",
sending the operator to look at the network. Real redis-servers on loopback; the CLI in a
subprocess (tests/test_cli.py's harness)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import redis

from crawlq.backends.redis import backend as backend_module
from crawlq.backends.redis.backend import RedisBackend
from crawlq.errors import BackendUnavailable
from crawlq.testing.redis_server import RedisServer

from .test_cli import APP, Cli, cli

__all__ = ["cli"]  # test_cli's fixture, used here too

PASSWORD = "s3cret-pw"
USER_PASSWORD = "crawler-pw"
WRONG = "wr0ng-pw"


@pytest.fixture(scope="module")
def guarded() -> Iterator[RedisServer]:
    """A server wanting PASSWORD, with an ACL user `crawler` (USER_PASSWORD)."""
    server = RedisServer(password=PASSWORD)
    server.start()
    try:
        admin = redis.Redis.from_url(server.url)
        admin.execute_command(  # type: ignore[no-untyped-call]
            "ACL", "SETUSER", "crawler", "on", f">{USER_PASSWORD}", "~*", "&*", "+@all"
        )
        admin.close()
        yield server
    finally:
        server.remove()


def refusals(port: int) -> list[tuple[str, str]]:
    """Refused URLs, each with how it must be shown (masked)."""
    at = f"127.0.0.1:{port}/0"
    return [
        (f"redis://:{WRONG}@{at}", f"redis://***@{at}"),  # a wrong password
        (f"redis://crawler:{WRONG}@{at}", f"redis://***@{at}"),  # the user's, wrong
        (f"redis://nobody:{USER_PASSWORD}@{at}", f"redis://***@{at}"),  # no such user
        (f"redis://{at}", f"redis://{at}"),  # no password at all
    ]


async def test_a_refused_login_is_named_as_such_without_the_password(
    guarded: RedisServer,
) -> None:
    for url, shown in refusals(guarded.port):
        with pytest.raises(BackendUnavailable) as refused:
            await RedisBackend(url).open()
        message = str(refused.value)
        assert message.startswith(f"Redis at {shown} refused the credentials: "), message
        assert "cannot reach" not in message
        assert WRONG not in message and USER_PASSWORD not in message and PASSWORD not in message
    with pytest.raises(BackendUnavailable, match=r"gives no password"):
        await RedisBackend(f"redis://127.0.0.1:{guarded.port}/0").open()


async def test_a_password_sent_to_a_server_without_one_is_refused_as_such(
    redis_server: RedisServer,
) -> None:
    at = f"127.0.0.1:{redis_server.port}/0"
    with pytest.raises(BackendUnavailable) as refused:
        await RedisBackend(f"redis://:{WRONG}@{at}").open()
    assert str(refused.value).startswith(f"Redis at redis://***@{at} refused the credentials: ")
    assert WRONG not in str(refused.value)


async def test_the_right_credentials_still_open(guarded: RedisServer) -> None:
    for url in (guarded.url, f"redis://crawler:{USER_PASSWORD}@127.0.0.1:{guarded.port}/0"):
        backend = RedisBackend(url)
        await backend.open()
        await backend.close()


def test_the_cli_says_the_credentials_were_refused_in_one_line(
    cli: Cli, guarded: RedisServer
) -> None:
    for url, shown in refusals(guarded.port):
        line = cli.refused("stats", "--backend", url)
        assert line.startswith(f"Error: Redis at {shown} refused the credentials: "), line
        assert WRONG not in line and USER_PASSWORD not in line and PASSWORD not in line


def test_a_worker_refused_its_login_exits_with_one_line(cli: Cli, guarded: RedisServer) -> None:
    at = f"127.0.0.1:{guarded.port}/0"
    env = cli.env(CRAWLQ_BACKEND=f"redis://:{WRONG}@{at}")  # the app's backend
    line = cli.refused("worker", APP, "--burst", env=env)
    assert line.startswith(f"Error: Redis at redis://***@{at} refused the credentials: "), line
    assert WRONG not in line


def test_the_cli_still_says_cannot_reach_for_a_server_that_is_not_there(cli: Cli) -> None:
    server = RedisServer(password=PASSWORD)  # a free port, no server started on it
    try:
        line = cli.refused("stats", "--backend", server.url)
    finally:
        server.remove()
    assert line.startswith(f"Error: cannot reach Redis at redis://***@127.0.0.1:{server.port}/0")
    assert PASSWORD not in line


async def test_a_password_changed_under_a_running_backend_is_named_as_such(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Its connections cut (as a rotation does), each call reconnects and is refused: that
    is a refused login, not a lost server."""
    monkeypatch.setattr(backend_module, "RECONNECT_PATIENCE", 0.3)
    server = RedisServer()
    server.start()
    admin = redis.Redis.from_url(server.url)
    at = f"127.0.0.1:{server.port}/0"
    admin.execute_command(  # type: ignore[no-untyped-call]
        "ACL", "SETUSER", "rotated", "on", f">{USER_PASSWORD}", "~*", "&*", "+@all"
    )
    backend = RedisBackend(f"redis://rotated:{USER_PASSWORD}@{at}")
    try:
        await backend.open()
        assert await backend.queue_stats() == []
        admin.execute_command(  # type: ignore[no-untyped-call]
            "ACL", "SETUSER", "rotated", "resetpass", f">{WRONG}"
        )
        admin.execute_command("CLIENT", "KILL", "USER", "rotated")  # type: ignore[no-untyped-call]
        for call in (backend.queue_stats, backend.limits, backend.check):
            with pytest.raises(BackendUnavailable) as refused:
                await call()
            message = str(refused.value)
            assert message.startswith(f"Redis at redis://***@{at} refused the credentials"), message
            assert USER_PASSWORD not in message and WRONG not in message
    finally:
        await backend.close()
        admin.close()
        server.remove()
