"""Noticing that redis-server restarted, so a process can forget what it remembers writing.

With `appendfsync everysec` a crashed server comes back without up to a second or two of
writes it had already confirmed (while an fsync runs, Redis replies but holds the write back).
The queue it comes back with is consistent, an earlier state of itself, but a process that
remembers its own writes (the crawler's "links already queued") would trust writes that are
gone. Every connection, on connecting, reads the server's `run_id`, which each start of
redis-server draws anew (a replica promoted by a failover has its own too): a new one after the
first bumps `epoch`, and such memory is only good within one epoch. A connection that broke
and came back to the same run (a network blip) leaves the epoch alone.

The same reply tells the server's time. Scripts judge due times, intervals and leases by the
server's clock (one clock for every machine), but a due time is computed where it is scheduled:
on a machine whose clock is 30 s fast, an element scheduled "now" waited 30 s. So `offset`
is the server's clock minus this machine's, once they disagree by over SKEW_TOLERANCE, and
the backend's `now()` adds it. (Closer clocks are left alone: the reading is only good to
half a round trip, and "now" must not land a hair in the server's future.)
"""

from __future__ import annotations

import time

from redis.asyncio.connection import AbstractConnection
from redis.exceptions import ResponseError

from ...observe.logs import logger

log = logger("crawlq.redis")


#: Seconds the clocks may disagree before `now()` follows the server's.
SKEW_TOLERANCE = 0.25


class RestartWatch:
    def __init__(self) -> None:
        self.run_id: bytes | None = None
        self.epoch = 0
        self.watching = True
        self.offset = 0.0  # the server's clock minus ours, when over SKEW_TOLERANCE

    async def on_connect(self, connection: AbstractConnection) -> None:
        """redis-py's `redis_connect_func`: its own handshake, then the server's run."""
        await connection.on_connect()
        if not self.watching:
            return
        try:
            asked = time.time()
            await connection.send_command("INFO", "server", check_health=False)
            info = await connection.read_response()
            self._read_clock(info, (asked + time.time()) / 2)
            run = run_id(info)
        except ResponseError as exc:  # an ACL without INFO (@dangerous), a renamed command
            run, reason = None, str(exc)
        else:
            reason = "no run_id in its INFO"
        if run is None:
            if not self.watching:  # another connection, at the same time, said it already
                return
            self.watching = False
            log.warning(
                "Redis gives no run_id (%s): a restart that lost confirmed writes (appendfsync "
                "everysec) will go unnoticed; allow INFO to the crawlq user",
                reason,
            )
            return
        if self.run_id is not None and run != self.run_id:
            self.epoch += 1
        self.run_id = run

    def _read_clock(self, info: object, ours: float) -> None:
        server = info_field(info, b"server_time_usec")
        if server is None:
            return
        offset = int(server) / 1e6 - ours
        offset = offset if abs(offset) > SKEW_TOLERANCE else 0.0
        if offset and not self.offset:
            log.warning(
                "this machine's clock is %.1f s %s Redis's: crawlq schedules by Redis's clock",
                abs(offset),
                "behind" if offset > 0 else "ahead of",
            )
        self.offset = offset


def run_id(info: object) -> bytes | None:
    """The `run_id` of an `INFO server` reply (bytes, or str when decoding is on)."""
    return info_field(info, b"run_id")


def info_field(info: object, name: bytes) -> bytes | None:
    """A field of an `INFO` reply (bytes, or str when decoding is on)."""
    raw = info.encode() if isinstance(info, str) else info
    if isinstance(raw, bytes):
        prefix = name + b":"
        for line in raw.splitlines():
            if line.startswith(prefix):
                return line[len(prefix) :].strip()
    return None
