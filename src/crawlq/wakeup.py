"""Waking idle workers when work arrives, across processes, without polling.

Each worker binds a datagram socket in Linux's abstract namespace (no file to clean up) and
publishes its address through the backend. Whoever makes work claimable sends one byte to
every address; a lost or refused datagram costs nothing, as an idle worker also wakes at the
next time it computed.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import uuid
from collections.abc import Iterable
from typing import Protocol

_PREFIX = "crawlq-"


def _sockaddr(address: str) -> bytes:
    return b"\0" + address.encode()


class Listener(Protocol):
    """What a worker waits on: `event` is set when another process may have made work
    claimable; `address` is what the worker publishes so others can reach it."""

    address: str
    event: asyncio.Event

    async def close(self) -> None: ...


class WakeSender:
    """Sends wake-ups; never blocks and never raises for a gone or busy listener."""

    def __init__(self) -> None:
        self._sock: socket.socket | None = None

    def send(self, addresses: Iterable[str]) -> None:
        if self._sock is None:
            self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
            self._sock.setblocking(False)
        for address in addresses:
            with contextlib.suppress(OSError):
                self._sock.sendto(b"!", _sockaddr(address))

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None


class WakeListener:
    """An event set whenever a wake-up arrives; bound to the running event loop."""

    def __init__(self) -> None:
        self.address = f"{_PREFIX}{os.getpid()}-{uuid.uuid4().hex[:12]}"
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self._sock.setblocking(False)
        self._sock.bind(_sockaddr(self.address))
        self.event = asyncio.Event()
        self._loop = asyncio.get_running_loop()
        self._loop.add_reader(self._sock.fileno(), self._drain)

    def _drain(self) -> None:
        try:
            while self._sock.recv(64):
                pass
        except (BlockingIOError, InterruptedError):
            pass
        self.event.set()

    async def close(self) -> None:
        self._loop.remove_reader(self._sock.fileno())
        self._sock.close()
