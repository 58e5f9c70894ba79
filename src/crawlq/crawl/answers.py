"""Answers a host has sent that this worker has not handled yet.

A request must not go to a host whose earlier answer (a 429 asking for a pause, say) is
already in. On a busy event loop such an answer sits in its socket, or parsed in its
connection's queue, for milliseconds before the task awaiting it runs, and requests sent
meanwhile land inside the pause it asked for. `before_send` lets those tasks run first:
their heads then pause the group (Politeness) before the new request checks it.
"""

from __future__ import annotations

import asyncio
import select

from aiohttp.client_proto import ResponseHandler

#: At most this many loop turns are spent letting a host's arrived answers be handled.
MAX_TURNS = 50


class PendingAnswers:
    """The connections, by host, that carry a request whose answer's head is not handled."""

    def __init__(self) -> None:
        self._by_host: dict[str, dict[ResponseHandler, None]] = {}

    def sent(self, host: str, protocol: ResponseHandler) -> None:
        self._by_host.setdefault(host, {})[protocol] = None

    def done(self, host: str, protocol: ResponseHandler) -> None:
        """Its answer's head was handled, or the request ended without one."""
        waiting = self._by_host.get(host)
        if waiting is not None:
            waiting.pop(protocol, None)
            if not waiting:
                del self._by_host[host]

    async def before_send(self, host: str) -> None:
        """Returns once no answer from `host` waits unhandled (in its socket or parsed)."""
        for _ in range(MAX_TURNS):
            waiting = self._by_host.get(host)
            if not waiting or not _any_arrived(waiting):
                return
            await asyncio.sleep(0)


def _any_arrived(waiting: dict[ResponseHandler, None]) -> bool:
    # poll, not select: a crawler holds thousands of connections, and select refuses any
    # descriptor from 1024 up.
    poller = None
    for protocol in waiting:
        if len(protocol) > 0:  # parsed, its task not run yet
            return True
        transport = protocol.transport
        sock = transport.get_extra_info("socket") if transport is not None else None
        if sock is not None:
            poller = poller or select.poll()
            poller.register(sock.fileno(), select.POLLIN)
    return poller is not None and bool(poller.poll(0))
