"""Stage outputs written to the results store from the event loop, on a thread of their own."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor

from ..results import Record, ResultsStore


class OutputWriter:
    """Writes `(stage, ref, records)` outputs (`ResultsStore.replace`) on a thread of its own:
    the fetch stage's outputs, one per download on the path that holds the sub-domain's slot,
    no longer queue behind parsing in the worker's thread pool (mean 45 ms in the demo ETL)."""

    def __init__(self, results: ResultsStore) -> None:
        self.results = results
        self._thread = ThreadPoolExecutor(1, thread_name_prefix="crawlq-results")

    async def replace(self, stage: str, ref: str, records: Sequence[Record]) -> None:
        """`ResultsStore.replace`, returning once it is committed."""
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(self._thread, self.results.replace, stage, ref, records)

    async def sync(self) -> None:
        """Every output written so far on disk (the worker awaits it before it records the
        elements that wrote them done: see App.sync_shared)."""
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(self._thread, self.results.sync)

    async def aclose(self) -> None:
        await asyncio.to_thread(self._thread.shutdown)  # its last writes finish first
