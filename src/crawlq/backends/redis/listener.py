"""Waking idle workers through Redis pub/sub: an operation that makes work claimable in a
queue publishes on `{ns}:wake:<queue>`, and every idle worker of that queue, on every
machine, hears it; workers of other queues sleep on.

A lost message costs nothing but latency: an idle worker also wakes at the next claimable
time the claim reported. After a lost connection the listener sets its event (so the worker
claims again at once) and subscribes again with a growing pause.
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
        self._subscribed = asyncio.Event()
        self._task = asyncio.create_task(self._listen(), name=f"crawlq-wake-{self.address}")

    async def started(self) -> RedisListener:
        """Returns once subscribed, so nothing published from now on is missed."""
        waiter = asyncio.ensure_future(self._subscribed.wait())
        await asyncio.wait([waiter, self._task], return_when=asyncio.FIRST_COMPLETED)
        waiter.cancel()
        if self._task.done():
            self._task.result()
        return self

    async def _listen(self) -> None:
        pause = 0.05
        while True:
            pubsub = self._client.pubsub(ignore_subscribe_messages=True)
            try:
                await pubsub.subscribe(*self._channels)
                self._subscribed.set()
                pause = 0.05
                while True:
                    message = await pubsub.get_message(timeout=None)
                    if message is not None:
                        self.event.set()
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
        with contextlib.suppress(asyncio.CancelledError):
            await self._task
