"""A running reprocess as other reprocesses see it, wherever they run: a row of its own in
the backend's worker list, beside its worker's, beaten from a task of its own while it works,
so that a second reprocess of its queues is refused while it lives, and no longer soon after
it was killed, on this machine or another.

    Heartbeat      how often a reprocess beats, how long after its last beat it counts as dead
    Registration   the row: registered, beaten, removed (an async context manager)
    busy           who serves some of given queues and is alive, as sentences

Rows: `reprocess:<host>:<pid>:<hex>` is a reprocess's registration, the same id plus
`/worker` the worker running its queues. A registration is alive while its last beat is at
most `dead_after` seconds old by the backend's clock (Redis's own: machines' clocks need not
agree); its worker's row lives and dies with it. A row of this machine whose process is no
more is dead at once. Other workers count until the backend forgets them (WORKER_TTL without
a heartbeat): they beat three times within it, and within their shortest lease.
"""

from __future__ import annotations

import asyncio
import os
import socket
import uuid
from collections.abc import Sequence
from dataclasses import dataclass

from ..backends import Backend
from ..errors import ConfigError
from ..liveness import pid_exists
from ..observe.logs import logger
from ..types import WorkerInfo

log = logger("crawlq.pipeline")

PREFIX = "reprocess:"
WORKER = "/worker"


@dataclass(frozen=True, kw_only=True, slots=True)
class Heartbeat:
    """A reprocess beats its registration `every` seconds and counts as dead (killed) once
    it missed `dead_after` seconds of beats: at least three beats, so a beat delayed by a
    busy backend or machine does not make a live one dead. Give every machine running the
    pipeline the same: the reprocess that decides reads its own `dead_after`."""

    every: float = 5.0
    dead_after: float = 30.0

    def __post_init__(self) -> None:
        if not 0 < self.every <= self.dead_after / 3:
            raise ConfigError(
                f"reprocess heartbeat every {self.every}s, dead after {self.dead_after}s:"
                " beat more than 0s apart, and at least three times within dead_after"
            )


class Registration:
    """`async with Registration(backend, queues):` registers a reprocess of `queues`, beats
    it every `heartbeat.every` seconds in a task of its own (so it goes on while a stage
    runs, however long), and removes it at the end. `host` and `pid` name the process: this
    one by default. Name the reprocess's worker `worker_id`."""

    def __init__(
        self,
        backend: Backend,
        queues: Sequence[str],
        *,
        heartbeat: Heartbeat,
        host: str | None = None,
        pid: int | None = None,
    ) -> None:
        self.backend = backend
        self.heartbeat = heartbeat
        host = host or socket.gethostname()
        pid = pid or os.getpid()
        self.id = f"{PREFIX}{host}:{pid}:{uuid.uuid4().hex[:6]}"
        self.worker_id = self.id + WORKER
        now = backend.now()
        self.info = WorkerInfo(
            id=self.id, host=host, pid=pid, queues=tuple(queues), started=now, heartbeat=now
        )
        self._beats: asyncio.Task[None] | None = None

    async def __aenter__(self) -> Registration:
        await self.backend.register_worker(self.info)
        self._beats = asyncio.create_task(self._beat(), name=f"crawlq-heartbeat-{self.id}")
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._beats is not None:
            self._beats.cancel()
            await asyncio.gather(self._beats, return_exceptions=True)
        try:
            await self.backend.unregister_worker(self.id)
        except Exception:  # it is dead once its beats stop: not worth the reprocess's result
            log.exception("removing reprocess registration %s failed", self.id)

    async def _beat(self) -> None:
        while True:
            await asyncio.sleep(self.heartbeat.every)
            try:
                # registered again by the backend if it was forgotten (a Redis restart)
                await self.backend.heartbeat(self.info, [], self.heartbeat.dead_after)
            except Exception:
                log.exception("heartbeat of reprocess %s failed; retrying", self.id)


def is_reprocess(worker_id: str) -> bool:
    """Whether a worker row is a reprocess's: its registration or its worker."""
    return worker_id.startswith(PREFIX)


async def busy(
    backend: Backend,
    queues: Sequence[str],
    *,
    heartbeat: Heartbeat,
    here: str | None = None,
    ignore: str = "",
) -> list[str]:
    """Who serves some of `queues` and is alive, one sentence each: workers, and reprocesses
    by their registration, except the reprocess `ignore` (an id) and its worker. `here` is
    this machine's name (socket.gethostname() by default)."""
    here = here or socket.gethostname()
    wanted = set(queues)
    now = backend.now()
    found = []
    for row in await backend.workers():
        if not wanted & set(row.queues) or (ignore and row.id in (ignore, ignore + WORKER)):
            continue
        if row.host == here and not pid_exists(row.pid):
            continue  # killed on this machine, its rows left behind
        if not is_reprocess(row.id):
            found.append(f"pid {row.pid} on {row.host}")
        elif not row.id.endswith(WORKER):  # a reprocess's worker counts as its registration
            age = max(0.0, now - row.heartbeat)
            if age <= heartbeat.dead_after:
                found.append(
                    f"reprocess pid {row.pid} on {row.host}, last heartbeat {age:.0f}s ago:"
                    f" if it was killed, it counts no more in {heartbeat.dead_after - age:.0f}s"
                )
    return found
