"""Connections of their own for the operations (FCALLs), beside redis-py's pool.

redis-py's asyncio client makes each command take a connection from its pool and check it
for unread replies first, then pack the command in Python: with that, one round trip cost
~90 us here where the same send and read on a held connection cost ~50. The operations are
one command each, so they go over these lanes instead: a call takes an idle connection, sends
the command packed here and reads the reply, and gives the connection back only after a whole
reply. Anything else (a broken connection, a timeout, a cancelled call) disconnects it, so
no lane ever holds a half-read reply, which is what the pool's check guards against.

The connections are made by the pool's own factory: the same URL, login, TLS, timeouts,
health checks (a PING after 30 idle seconds) and retries of the connection handshake.
"""

from __future__ import annotations

from typing import Any

from redis.asyncio import Redis
from redis.asyncio.connection import AbstractConnection
from redis.exceptions import ConnectionError, ResponseError, TimeoutError


def pack(*args: bytes | str | int | float) -> bytes:
    """One command in the Redis protocol (RESP): an array of bulk strings."""
    out = [b"*%d\r\n" % len(args)]
    for arg in args:
        if isinstance(arg, str):
            data = arg.encode()
        elif isinstance(arg, bytes):
            data = arg
        else:
            data = repr(arg).encode()
        out.append(b"$%d\r\n%b\r\n" % (len(data), data))
    return b"".join(out)


class Lanes:
    def __init__(self, client: Redis) -> None:
        self.client = client
        self._pool: Any = client.connection_pool  # make_connection is untyped
        self._idle: list[AbstractConnection] = []
        self._closed = False

    async def call(self, command: bytes) -> Any:
        """The reply of one packed command; a Redis error reply is raised as ResponseError."""
        connection: AbstractConnection
        connection = self._idle.pop() if self._idle else self._pool.make_connection()
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
        else:
            self._idle.append(connection)

    async def close(self) -> None:
        """Disconnects the idle connections, and each busy one as its call ends."""
        self._closed = True
        await self._drop_idle()

    async def _drop_idle(self) -> None:
        idle, self._idle = self._idle, []
        for connection in idle:
            await connection.disconnect(nowait=True)
