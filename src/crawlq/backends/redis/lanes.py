"""Connections of their own for the operations (FCALLs), beside redis-py's pool.

redis-py's asyncio client makes each command take a connection from its pool and check it
for unread replies first, then pack the command in Python: with that, one round trip cost
~90 us here where the same send and read on a held connection cost ~50. The operations are
one command each, so they go over these lanes instead: a call takes an idle connection, sends
the command packed here and reads the reply, and gives the connection back only after a whole
reply. Anything else (a broken connection, a timeout, a cancelled call) disconnects it, so
no lane ever holds a half-read reply, which is what the pool's check guards against.

The connections are made by the pool's own factory: the same URL, login, TLS, timeouts,
health checks (a PING after 30 idle seconds) and retries of the connection handshake. At most
`max_connections` of them (the URL's, else 64) are open: more calls at once wait for a lane,
so a worker of a thousand tasks that all schedule at once never opens a thousand connections.
Idle lanes are taken newest first, so after a burst the oldest sit unused: the next call
closes those idle for over a minute (a worker calls every few seconds). A lane whose server
vanished without a word is freed by TCP keepalive (see the backend's `_KEEPALIVE`): a few
such calls must not hold every lane.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterable
from typing import Any

from redis.asyncio import Redis
from redis.asyncio.connection import AbstractConnection
from redis.exceptions import ConnectionError, ResponseError, TimeoutError

from ...errors import BackendError


def pack(*args: bytes | str | int | float) -> bytes:
    """One command in the Redis protocol (RESP): an array of bulk strings."""
    return b"*%d\r\n" % len(args) + bulk_strings(args)


def bulk_strings(args: Iterable[bytes | str | int | float]) -> bytes:
    """Arguments as RESP bulk strings: a command without its array's header (see `pack`)."""
    out = []
    for arg in args:
        if isinstance(arg, str):
            data = arg.encode()
        elif isinstance(arg, bytes):
            data = arg
        else:
            data = repr(arg).encode()
        out.append(b"$%d\r\n%b\r\n" % (len(data), data))
    return b"".join(out)


#: Lanes when the URL sets no max_connections (redis-py's pool then has no limit at all).
DEFAULT_MAX_LANES = 64
UNLIMITED = 2**31  # redis-py's max_connections when none is given
IDLE_SECONDS = 60.0


class Lanes:
    def __init__(
        self,
        client: Redis,
        *,
        idle_seconds: float = IDLE_SECONDS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.client = client
        self._pool: Any = client.connection_pool  # make_connection is untyped
        limit = self._pool.max_connections
        self.max_lanes: int = DEFAULT_MAX_LANES if limit >= UNLIMITED else limit
        self._free = asyncio.Semaphore(self.max_lanes)
        self._idle: list[tuple[AbstractConnection, float]] = []  # and since when, oldest first
        self._idle_seconds = idle_seconds
        self._clock = clock
        self._closed = False

    @property
    def idle(self) -> int:
        return len(self._idle)

    async def call(self, command: bytes) -> Any:
        """The reply of one packed command; a Redis error reply is raised as ResponseError."""
        async with self._free:
            return await self._call(command)

    async def _call(self, command: bytes) -> Any:
        if self._closed:  # it waited for a lane while the backend closed
            raise BackendError("the Redis backend was closed")
        connection: AbstractConnection
        connection = self._idle.pop()[0] if self._idle else self._pool.make_connection()
        try:
            await connection.send_packed_command(command)
            reply = await connection.read_response()
        except ResponseError:
            await self._give_back(connection)  # the error was the whole reply
            raise
        except (ConnectionError, TimeoutError, OSError):
            # The server went away or restarted: its other idle connections are as stale.
            await connection.disconnect(nowait=True)
            await self._drop_idle()
            raise
        except BaseException:
            await connection.disconnect(nowait=True)
            raise
        await self._give_back(connection)
        return reply

    async def _give_back(self, connection: AbstractConnection) -> None:
        if self._closed:  # a call that was under way when the lanes closed
            await connection.disconnect(nowait=True)
            return
        now = self._clock()
        self._idle.append((connection, now))
        while self._idle[0][1] < now - self._idle_seconds:
            stale, _ = self._idle.pop(0)
            await stale.disconnect(nowait=True)

    async def close(self) -> None:
        """Disconnects the idle connections, and each busy one as its call ends."""
        self._closed = True
        await self._drop_idle()

    async def _drop_idle(self) -> None:
        idle, self._idle = self._idle, []
        for connection, _ in idle:
            await connection.disconnect(nowait=True)
