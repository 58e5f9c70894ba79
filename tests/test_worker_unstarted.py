"""A worker told to hurry (a second stop, or outputs it could not put on disk) just after a
claim: the elements of tasks it created but that never took a step go back to the queue at
once, as those of running tasks do, not after their leases run out."""

from __future__ import annotations

import asyncio
from pathlib import Path

from crawlq import App, Context
from crawlq.backends import Backend
from crawlq.types import Claimed
from crawlq.worker import Worker


async def test_elements_claimed_just_before_a_hurried_stop_go_back_at_once(
    tmp_path: Path,
) -> None:
    app = App(f"sqlite:///{tmp_path / 'queue.db'}")
    never = asyncio.Event()

    @app.task(group=None, lease=600)
    async def work(ctx: Context, n: int) -> None:
        await never.wait()

    await app.aschedule_many(work, [1, 2, 3])
    worker = Worker(app, burst=True, concurrency=3)
    start = worker._start

    def start_then_hurry(backend: Backend, claimed: Claimed, deadline: float) -> None:
        start(backend, claimed, deadline)
        worker.stop()
        worker.stop()  # hurry: as a second Ctrl-C, or a failed sync of the outputs

    worker._start = start_then_hurry  # type: ignore[method-assign]
    stats = await worker.run()
    backend = await app.backend()
    (queue,) = await backend.queue_stats(["work"])
    await app.aclose()

    assert (queue.running, queue.due) == (0, 3)
    assert stats.released == 3
