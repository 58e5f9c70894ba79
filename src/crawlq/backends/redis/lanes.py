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

Keepalive does not help when the server's machine is there but redis-server does not answer
(stopped with SIGSTOP, wedged, a proxy whose upstream hangs): the kernel acknowledges the
request and the keepalive probes, and a call waited forever (measured: a schedule to a
stopped server still waiting after 150 s). A timer on every reply would bound it but costs
~17% of a one-element call's rate, so one watchdog per lanes looks at the calls under way
every second instead, from a thread (a call only numbers itself, and the event loop keeps
no timer for it: either was measurable on a one-element schedule), and disconnects any
lane it has seen waiting over CALL_TIMEOUT, on the loop: its call fails with
a TimeoutError that says so, and is sent again or reported as the backend's other lost
connections are.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

from redis.asyncio import Redis
from redis.asyncio.connection import AbstractConnection
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
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
#: Seconds a call may wait for its reply before its lane is given up on. Redis serves one
#: command at a time, and crawlq's take well under a second; this leaves room for a server
#: busy with someone's slow command.
CALL_TIMEOUT = 30.0
NO_RETRY = Retry(NoBackoff(), 0)


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
        self._busy: dict[AbstractConnection, int] = {}  # calls under way, by their number
        self._calls = 0
        self._overdue: set[AbstractConnection] = set()
        self._watchdog: threading.Thread | None = None
        self._stop_watching = threading.Event()

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
        if self._idle:
            connection = self._idle.pop()[0]
        else:
            connection = self._pool.make_connection()
            # Not redis-py's retries within a call (connecting, its health check's PING): a
            # call that fails is sent again by the backend, whose patience is bounded, and a
            # lane given up on by the watchdog must not connect again within the same call.
            connection.retry = NO_RETRY
        if self._watchdog is None:
            loop = asyncio.get_running_loop()
            self._watchdog = threading.Thread(
                target=self._watch, args=(loop,), name="crawlq-redis-lanes", daemon=True
            )
            self._watchdog.start()
        self._calls += 1
        self._busy[connection] = self._calls
        try:
            await connection.send_packed_command(command)
            reply = await connection.read_response()
        except ResponseError:
            await self._give_back(connection)  # the error was the whole reply
            raise
        except (ConnectionError, TimeoutError, OSError) as exc:
            # The server went away or restarted: its other idle connections are as stale.
            await connection.disconnect(nowait=True)
            await self._drop_idle()
            if connection in self._overdue:
                raise TimeoutError(
                    f"no reply from Redis in {CALL_TIMEOUT:g} s (is redis-server stopped "
                    "or overloaded?)"
                ) from None
            raise exc
        except BaseException:
            await connection.disconnect(nowait=True)
            raise
        finally:
            del self._busy[connection]
            if self._overdue:
                self._overdue.discard(connection)
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

    def _watch(self, loop: asyncio.AbstractEventLoop) -> None:
        """In its thread: has each lane whose call it has seen waiting over CALL_TIMEOUT for
        its reply (seen first up to a second after it began) disconnected, on the loop."""
        seen: dict[tuple[AbstractConnection, int], float] = {}  # call -> first seen
        while not self._stop_watching.wait(min(1.0, CALL_TIMEOUT / 4)):
            now = time.monotonic()
            busy = list(self._busy.items())  # one step under the GIL: the loop may change it
            seen = {call: seen.get(call, now) for call in busy}
            due = now - CALL_TIMEOUT
            late = [connection for (connection, _), since in seen.items() if since < due]
            if late:  # again each second, should one connect again
                with contextlib.suppress(RuntimeError):  # the loop is closed
                    loop.call_soon_threadsafe(self._give_up, late)

    def _give_up(self, connections: list[AbstractConnection]) -> None:
        for connection in connections:
            if connection in self._busy:
                self._overdue.add(connection)
                task = asyncio.ensure_future(connection.disconnect(nowait=True))
                task.add_done_callback(_quietly)

    async def close(self) -> None:
        """Disconnects the idle connections, and each busy one as its call ends."""
        self._closed = True
        await self._drop_idle()
        if self._watchdog is not None:
            self._stop_watching.set()
            self._watchdog = None

    async def _drop_idle(self) -> None:
        idle, self._idle = self._idle, []
        for connection, _ in idle:
            await connection.disconnect(nowait=True)


def _quietly(task: asyncio.Future[Any]) -> None:
    """A disconnect's failure is nobody's business: the call it ends fails on its own."""
    if not task.cancelled():
        task.exception()
