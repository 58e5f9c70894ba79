"""Stage outputs written to the results store from the event loop, on a thread of their own."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from concurrent.futures import ThreadPoolExecutor

from ..results import Record, ResultsStore


class OutputWriter:
    """Writes `(stage, ref, records)` outputs (`ResultsStore.replace`) on a thread of its own:
    they no longer queue behind parsing in the worker's thread pool (mean 45 ms in the demo
    ETL). The fetch stage's, one per download, are written with the worker's sync (`note`)."""

    def __init__(self, results: ResultsStore, stored: Callable[[], Awaitable[None]]) -> None:
        self.results = results
        self._stored = stored
        self._pending: list[tuple[str, str, Sequence[tuple[str, str]]]] = []
        self._thread = ThreadPoolExecutor(1, thread_name_prefix="crawlq-results")

    async def replace(self, stage: str, ref: str, records: Sequence[Record]) -> None:
        """`ResultsStore.replace`, returning once it is committed."""
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(self._thread, self.results.replace, stage, ref, records)

    def note(self, stage: str, ref: str, forget: Sequence[tuple[str, str]] = ()) -> None:
        """`stage` (the fetch stage) stored its output for `ref` where `stored()` puts it on
        disk (the WARC store): the reference, what the next stage's reprocess reads, is
        written by the next `sync`, once `stored()` has returned, and the `(stage, ref)`
        outputs of `forget` are removed then. Written at once, a worker killed before its
        WARC records were indexed left an input without its response."""
        self._pending.append((stage, ref, forget))

    async def sync(self) -> None:
        """Every output written so far on disk (the worker awaits it before it records the
        elements that wrote them done: see App.sync_shared), noted references included."""
        loop = asyncio.get_running_loop()
        noted, self._pending = self._pending, []
        if noted:
            await self._stored()  # raising: the references are dropped, their pages run again
            await loop.run_in_executor(self._thread, self._write_noted, noted)
        await loop.run_in_executor(self._thread, self.results.sync)

    def _write_noted(self, noted: list[tuple[str, str, Sequence[tuple[str, str]]]]) -> None:
        for stage, ref, forget in noted:
            for gone in forget:
                self.results.forget(*gone)
            self.results.replace(stage, ref, [])

    async def aclose(self) -> None:
        await asyncio.to_thread(self._thread.shutdown)  # its last writes finish first
