"""Waking idle workers through Redis pub/sub: an operation that makes work claimable in a
queue publishes on `{ns}:wake:<queue>`, and every idle worker of that queue, on every
machine, hears it; workers of other queues sleep on.

A lost message costs nothing but latency: an idle worker also wakes at the next claimable
time the claim reported (or after 30 s). Messages published while the listener was not
subscribed are lost, so each time the server confirms a subscription again the listener sets
its event, and the worker claims again at once. redis-py itself reconnects a broken pub/sub
connection and subscribes again, without a word to its reader: only the server's subscribe
confirmation tells. (Before, the listener set its event only when redis-py gave up, and an
element scheduled just after a restart of Redis, before the listener was back, waited for the
worker's 30 s idle timeout.) When redis-py does give up, the listener subscribes again
itself, with a growing pause.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Sequence

from redis.asyncio import Redis
from redis.exceptions import ConnectionError, TimeoutError

from ...observe.logs import logger

log = logger("crawlq.redis")


class RedisListener:
    def __init__(self, client: Redis, channels: Sequence[str]) -> None:
        self.address = " ".join(channels)
        self.event = asyncio.Event()
        self._client = client
        self._channels = list(channels)
        self._wanted = len(set(channels))
        self._subscribed = asyncio.Event()
        self._task = asyncio.create_task(self._listen(), name=f"crawlq-wake-{self.address}")

    async def started(self) -> RedisListener:
        """Returns once the server confirmed every subscription, so nothing published from
        now on is missed."""
        waiter = asyncio.ensure_future(self._subscribed.wait())
        await asyncio.wait([waiter, self._task], return_when=asyncio.FIRST_COMPLETED)
        waiter.cancel()
        if self._task.done():
            self._task.result()
        return self

    async def _listen(self) -> None:
        pause = 0.05
        while True:
            pubsub = self._client.pubsub()
            try:
                await pubsub.subscribe(*self._channels)
                pause = 0.05
                while True:
                    message = await pubsub.get_message(timeout=None)
                    if message is None:
                        continue
                    if message["type"] != "subscribe":
                        self.event.set()
                    elif message["data"] >= self._wanted:
                        # Subscribed to every channel: from now on nothing is missed. Again
                        # after a lost connection: claim, for what came meanwhile.
                        if self._subscribed.is_set():
                            self.event.set()
                        self._subscribed.set()
            except (ConnectionError, TimeoutError, OSError) as exc:
                log.warning("wake-up channel lost (%s); subscribing again", exc)
                self.event.set()
                await asyncio.sleep(pause)
                pause = min(pause * 2, 2.0)
            finally:
                with contextlib.suppress(Exception):
                    await pubsub.aclose()  # type: ignore[no-untyped-call,unused-ignore]

    async def close(self) -> None:
        self._task.cancel()
        # Or its error, should it have ended on one (reported by `started`).
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await self._task
