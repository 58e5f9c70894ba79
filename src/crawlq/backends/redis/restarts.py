"""Noticing that redis-server restarted, so a process can forget what it remembers writing.

With `appendfsync everysec` a crashed server comes back without up to a second or two of
writes it had already confirmed (while an fsync runs, Redis replies but holds the write back).
The queue it comes back with is consistent, an earlier state of itself, but a process that
remembers its own writes (the crawler's "links already queued") would trust writes that are
gone. Every connection, on connecting, reads the server's `run_id`, which each start of
redis-server draws anew (a replica promoted by a failover has its own too): a new one after the
first bumps `epoch`, and such memory is only good within one epoch. A connection that broke
and came back to the same run (a network blip) leaves the epoch alone.
"""

from __future__ import annotations

import logging

from redis.asyncio.connection import AbstractConnection
from redis.exceptions import ResponseError

log = logging.getLogger("crawlq.redis")


class RestartWatch:
    def __init__(self) -> None:
        self.run_id: bytes | None = None
        self.epoch = 0
        self.watching = True

    async def on_connect(self, connection: AbstractConnection) -> None:
        """redis-py's `redis_connect_func`: its own handshake, then the server's run."""
        await connection.on_connect()
        if not self.watching:
            return
        try:
            await connection.send_command("INFO", "server", check_health=False)
            run = run_id(await connection.read_response())
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


def run_id(info: object) -> bytes | None:
    """The `run_id` of an `INFO server` reply (bytes, or str when decoding is on)."""
    raw = info.encode() if isinstance(info, str) else info
    if isinstance(raw, bytes):
        for line in raw.splitlines():
            if line.startswith(b"run_id:"):
                return line[len(b"run_id:") :].strip()
    return None
