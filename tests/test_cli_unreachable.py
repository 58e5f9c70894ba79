"""Redis servers that accept the connection and never answer (a wedged proxy, a wrong port, a
TLS port asked in plain text or the reverse): commands end in one `Error:` line in seconds
instead of hanging. Real TCP servers on 127.0.0.1 and the real redis-server of the tests;
the CLI in a subprocess (tests/test_cli.py's harness)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

import pytest

from crawlq.backends import open_backend
from crawlq.backends.redis import backend as redis_backend
from crawlq.errors import BackendUnavailable
from crawlq.testing.redis_server import RedisServer

from .test_cli import Cli, cli

__all__ = ["cli"]  # test_cli's fixture, used here too

#: Well past the backend's own bound (OPEN_TIMEOUT), well short of the harness's 60 s.
PATIENCE = redis_backend.OPEN_TIMEOUT + 10

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


async def _silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Accepts, reads whatever comes, writes nothing; closes when the client hangs up."""
    await reader.read()


@asynccontextmanager
async def listening(handler: Handler) -> AsyncIterator[int]:
    """A TCP server on a free loopback port of this test's event loop; its port."""
    writers: list[asyncio.StreamWriter] = []

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writers.append(writer)
        try:
            await handler(reader, writer)
        finally:
            writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    try:
        yield server.sockets[0].getsockname()[1]
    finally:
        server.close()
        for writer in writers:
            writer.close()
        await server.wait_closed()


async def refused_in_time(cli: Cli, url: str) -> str:
    """Runs `crawlq stats` against `url` (off the event loop, which serves the server);
    its one error line, which must come before PATIENCE runs out."""
    started = time.monotonic()
    line = await asyncio.to_thread(cli.refused, "stats", "--backend", url)
    took = time.monotonic() - started
    assert took < PATIENCE, f"took {took:.1f} s: {line}"
    return line


async def test_a_server_that_never_answers_is_an_error_not_a_hang(cli: Cli) -> None:
    async with listening(_silent) as port:
        line = await refused_in_time(cli, f"redis://127.0.0.1:{port}/0")
    assert line.startswith(f"Error: cannot reach Redis at redis://127.0.0.1:{port}/0"), line


async def test_tls_asked_of_a_server_that_never_answers_is_an_error(cli: Cli) -> None:
    async with listening(_silent) as port:
        line = await refused_in_time(cli, f"rediss://127.0.0.1:{port}/0")
    assert line.startswith(f"Error: cannot reach Redis at rediss://127.0.0.1:{port}/0"), line


async def test_tls_asked_of_a_plain_text_redis_is_an_error(
    cli: Cli, redis_server: RedisServer
) -> None:
    """redis-server reads the TLS hello as the start of a command and waits for its end."""
    url = redis_server.url.replace("redis://", "rediss://")
    line = await refused_in_time(cli, url)
    assert line.startswith(f"Error: cannot reach Redis at {url}"), line


def pong_once() -> Handler:
    """+PONG to every command of the first connection made (the probe's), then silence."""
    answered = False

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal answered
        if answered:
            await reader.read()
            return
        answered = True
        while (line := await reader.readline()).startswith(b"*"):
            for _ in range(int(line[1:])):
                size = int((await reader.readline())[1:])
                await reader.readexactly(size + 2)
            writer.write(b"+PONG\r\n")
            await writer.drain()

    return handler


async def test_opening_is_bounded_as_a_whole(monkeypatch: pytest.MonkeyPatch) -> None:
    """A server that passes the probe and then never answers: the open gives up after
    OPEN_TIMEOUT (made short here) with the error of an unreachable server."""
    monkeypatch.setattr(redis_backend, "OPEN_TIMEOUT", 1.0)
    async with listening(pong_once()) as port:
        backend = open_backend(f"redis://127.0.0.1:{port}/0")
        started = time.monotonic()
        with pytest.raises(BackendUnavailable, match="no answer in 1 s"):
            await backend.open()
        assert time.monotonic() - started < 10
