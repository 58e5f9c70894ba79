"""Stages as first-class: a pipeline is a chain of tasks, each with its own queue, whose
outputs are stored and whose successors receive a reference, never the payload.

    fetch stage     element: a URL (or {"url": ...}); the function returns a Response,
                    stored in WARC files (with an index); the next stage gets its URL
    later stages    element: that reference; the function gets the previous stage's stored
                    output (the StoredResponse, or the records it wrote) and returns records,
                    which replace what it wrote for that reference last time

Because every stage reads stored inputs, `reprocess` re-runs a stage (and the stages after
it) over what is already stored, without fetching anything, and running it twice leaves the
same rows.
"""

from __future__ import annotations

import asyncio
import dataclasses
import fnmatch
import functools
import weakref
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..app import App
from ..backends import Backend
from ..context import Context
from ..crawl.response import Response
from ..crawl.store import WarcStore
from ..crawl.warc import StoredResponse
from ..errors import ConfigError, Permanent
from ..observe.logs import redact
from ..results import Record, ResultsStore
from ..results.store import as_records
from ..retry import Retry
from ..tasks import GroupOption, KeyFunction, Task, call_task_function
from ..worker import Worker, WorkerStats
from .registration import Heartbeat, Registration, busy
from .writer import OutputWriter

WARC = "crawlq.pipeline.warc"
OUTPUTS = "crawlq.pipeline.outputs"
SCHEDULE_CHUNK = 5_000

_pipelines: weakref.WeakKeyDictionary[App, Pipeline] = weakref.WeakKeyDictionary()


@dataclass(frozen=True, kw_only=True, slots=True)
class Stage:
    name: str
    task: Task[Any]
    fetch: bool
    index: int


@dataclass(frozen=True, kw_only=True, slots=True)
class ReprocessResult:
    stage: str
    scheduled: int
    stages: tuple[str, ...]
    worker: WorkerStats | None
    finished: bool = False  # the finish step ran (not when inputs died)


class Pipeline:
    """`Pipeline(app, data="etl-data/")`: raw responses go to `data/warc/`, records to
    `data/results.sqlite`. Declare stages in order with `@pipeline.fetch` (the first) and
    `@pipeline.stage`; `@pipeline.finish` marks what runs once a run or a reprocess is
    over (publishing a report). A reprocess beats its registration as `heartbeat` says (see
    registration.py): one killed, anywhere, stops refusing the next `dead_after` seconds
    after its last beat."""

    def __init__(self, app: App, *, data: Path | str, heartbeat: Heartbeat | None = None) -> None:
        if app in _pipelines:
            raise ConfigError(f"{app!r} already has a pipeline")
        self.app = app
        self.data = Path(data)
        self.data.mkdir(parents=True, exist_ok=True)  # the app's queue may live there too
        self.warc_dir = self.data / "warc"
        self.results = ResultsStore(self.data / "results.sqlite")
        self.heartbeat = heartbeat or Heartbeat()
        self.stages: list[Stage] = []
        self._finish: Callable[[ResultsStore], Any] | None = None
        app.provide(WARC, lambda: WarcStore(self.warc_dir))
        app.provide(OUTPUTS, lambda: OutputWriter(self.results, self._sync_responses))
        _pipelines[app] = self

    def __repr__(self) -> str:
        return f"<Pipeline {' -> '.join(s.name for s in self.stages)} in {self.data}>"

    @staticmethod
    def of(app: App) -> Pipeline:
        pipeline = _pipelines.get(app)
        if pipeline is None:
            raise ConfigError(f"{app!r} has no pipeline: declare one with Pipeline(app, ...)")
        return pipeline

    # -- declaring ------------------------------------------------------------------------

    def fetch(
        self,
        *,
        queue: str | None = None,
        group: GroupOption = "host",
        key: KeyFunction | None = None,
        retry: Retry | None = None,
        max_attempts: int | None = None,
        lease: float = 60.0,
        timeout: float | None = None,
        seen: bool = False,
    ) -> Callable[[Callable[..., Awaitable[Response | None]]], Task[Any]]:
        """The fetch stage: `async def download(ctx, url) -> Response` (None: nothing to
        store). Its response is written to WARC, then the next stage is scheduled with the
        response's URL."""
        if self.stages:
            raise ConfigError("the fetch stage is the first stage of a pipeline")

        def declare(function: Callable[..., Awaitable[Response | None]]) -> Task[Any]:
            if not asyncio.iscoroutinefunction(function):
                raise ConfigError(f"fetch stage {function.__name__!r} must be async")
            name = queue or function.__name__

            async def run(ctx: Context, element: Any) -> None:
                response = await function(ctx, element)
                if response is None:
                    return
                warc: WarcStore = ctx.app.shared(WARC)
                for hop in response.chain:
                    await warc.put(hop)
                # the reference, for `reprocess` to find (the records are the WARC's), written
                # once the responses are on disk and indexed, before this task is done; a URL
                # that redirected here is no page (now): what every stage made of it goes
                moved = {hop.url for hop in response.history} - {response.url}
                writer: OutputWriter = ctx.app.shared(OUTPUTS)
                writer.note(name, response.url, [(s.name, u) for u in moved for s in self.stages])
                await self._next(ctx, name, response.url)

            return self._add_stage(
                name,
                function,
                run,
                fetch=True,
                group=group,
                key=key,
                retry=retry,
                max_attempts=max_attempts,
                lease=lease,
                timeout=timeout,
                seen=seen,
            )

        return declare

    def stage(
        self,
        *,
        queue: str | None = None,
        retry: Retry | None = None,
        max_attempts: int | None = None,
        lease: float = 60.0,
        timeout: float | None = None,
    ) -> Callable[[Callable[..., Any]], Task[Any]]:
        """A later stage: `def parse(ctx, stored) -> Iterable[Record]`, sync (run in the
        worker's thread pool with `ctx.sync`) or async. `stored` is the StoredResponse after
        a fetch stage, otherwise the list of records the previous stage wrote."""
        if not self.stages:
            raise ConfigError("declare the fetch stage first (@pipeline.fetch)")

        def declare(function: Callable[..., Any]) -> Task[Any]:
            name = queue or function.__name__
            is_async = asyncio.iscoroutinefunction(function)
            index = len(self.stages)

            previous = self.stages[index - 1]

            def step(sync: Any, stored: StoredResponse | None, ref: str) -> None:
                # a sync stage reads its input, runs and stores its records in one trip to
                # the thread pool: every trip costs the event loop a GIL hand-over
                given = self.results.records(previous.name, ref) if stored is None else stored
                self.results.replace(name, ref, as_records(function(sync, given)))

            async def run(ctx: Context, ref: str) -> None:
                if not isinstance(ref, str):
                    raise Permanent(f"stage {name}: expected a reference (a string), got {ref!r}")
                ctx.app.shared(OUTPUTS)  # a sync stage writes the store itself: synced with it
                if is_async:
                    stored = await self._input(ctx, index - 1, ref)
                    records = as_records(await call_task_function(function, True, ctx, stored))
                    await self._write(ctx, name, ref, records)
                else:
                    response = await self._stored_response(ctx, ref) if previous.fetch else None
                    await call_task_function(functools.partial(step, ref=ref), False, ctx, response)
                await self._next(ctx, name, ref)

            return self._add_stage(
                name,
                function,
                run,
                fetch=False,
                group=None,
                retry=retry,
                max_attempts=max_attempts,
                lease=lease,
                timeout=timeout,
            )

        return declare

    def _add_stage(
        self,
        name: str,
        function: Callable[..., Any],
        run: Callable[[Context, Any], Awaitable[None]],
        *,
        fetch: bool,
        **options: Any,
    ) -> Task[Any]:
        """Registers `run` as the task of stage `name` (on the queue of that name, named
        and documented as the user's `function`) and appends the stage."""
        run.__name__ = run.__qualname__ = name
        run.__doc__ = function.__doc__
        task = self.app.task(queue=name, **options)(run)
        self.stages.append(Stage(name=name, task=task, fetch=fetch, index=len(self.stages)))
        return task

    def finish(self, function: Callable[[ResultsStore], Any]) -> Callable[[ResultsStore], Any]:
        """Marks `function(results)` as what runs once the stages are done (a report)."""
        self._finish = function
        return function

    # -- running --------------------------------------------------------------------------

    def stage_named(self, name: str) -> Stage:
        for stage in self.stages:
            if stage.name == name:
                return stage
        names = ", ".join(s.name for s in self.stages)
        raise ConfigError(f"no stage {name!r} in the pipeline (stages: {names})")

    def after(self, name: str) -> list[Stage]:
        """`name` and every stage after it."""
        return self.stages[self.stage_named(name).index :]

    async def _input(self, ctx: Context, index: int, ref: str) -> StoredResponse | list[Record]:
        previous = self.stages[index]
        if previous.fetch:
            return await self._stored_response(ctx, ref)
        return await asyncio.to_thread(self.results.records, previous.name, ref)

    async def _stored_response(self, ctx: Context, ref: str) -> StoredResponse:
        warc: WarcStore = ctx.app.shared(WARC)
        stored = await warc.get(ref)
        if stored is None:
            raise Permanent(f"no stored response for {redact(ref)} in {self.warc_dir}")
        return stored

    async def _sync_responses(self) -> None:
        warc: WarcStore = self.app.shared(WARC)
        await warc.sync()

    async def _write(self, ctx: Context, name: str, ref: str, records: list[Record]) -> None:
        writer: OutputWriter = ctx.app.shared(OUTPUTS)
        await writer.replace(name, ref, records)

    async def _next(self, ctx: Context, name: str, ref: str) -> None:
        index = self.stage_named(name).index + 1
        if index < len(self.stages):
            # written with this task's ack, in one batch with the other tasks' follow-ups
            await ctx.schedule_with_ack(self.stages[index].task, [ref])

    def inputs(self, stage: str, where: Sequence[str] = ()) -> list[str]:
        """The stored references `stage` reads (what the stage before it produced), those
        matching any glob of `where` if given."""
        found = self.stage_named(stage)
        if found.fetch:
            raise ConfigError(
                f"{stage!r} is the fetch stage: re-running it fetches again"
                " (schedule its elements instead); reprocess the stage after it"
            )
        refs = self.results.refs(self.stages[found.index - 1].name)
        if where:
            refs = [r for r in refs if any(fnmatch.fnmatchcase(r, w) for w in where)]
        return refs

    async def reprocess(
        self,
        stage: str,
        *,
        where: Sequence[str] = (),
        run: bool = True,
        concurrency: int = 100,
        force: bool = False,
    ) -> ReprocessResult:
        """Schedules `stage` over its stored inputs; with `run`, works its queue and the
        later stages' until each input is done or dead (retries waited for; nothing else
        runs, so nothing is fetched), then runs the finish step unless an input died.

        With `run`, workers already serving those queues, another reprocess of them
        included, are refused (ConfigError) unless `force`: they would take part of the work
        with the code they loaded, old code beside the new. A reprocess registers itself
        while it runs (registration.py); one killed counts no more at once on this machine,
        `heartbeat.dead_after` seconds after its last beat on another."""
        names = tuple(s.name for s in self.after(stage))
        backend = await self.app.backend()
        if not run:
            return await self._schedule(backend, stage, names, where)
        # registered before looking for others: of two started at once, neither goes unseen
        async with Registration(backend, names, heartbeat=self.heartbeat) as registration:
            if not force:
                await _refuse_busy_queues(backend, names, self.heartbeat, registration.id)
            result = await self._schedule(backend, stage, names, where)
            # Until every input is done or dead: a retry may be up to its cap away.
            horizon = max(5.0, *(s.task.options.retry.cap for s in self.after(stage)))
            stats = await Worker(
                self.app,
                queues=list(names),
                burst=True,
                burst_horizon=horizon,
                concurrency=concurrency,
                name=registration.worker_id,
            ).run()
        if stats.dead == 0:
            self.run_finish()
        return dataclasses.replace(result, worker=stats, finished=stats.dead == 0)

    async def _schedule(
        self, backend: Backend, stage: str, names: tuple[str, ...], where: Sequence[str]
    ) -> ReprocessResult:
        refs = self.inputs(stage, where)
        # what these stages wrote for these inputs is the old code's: a key the new code emits
        # from another input goes to that input, whichever of the two runs first
        await asyncio.to_thread(self.results.mark_stale, names, refs)
        task = self.stage_named(stage).task
        for start in range(0, len(refs), SCHEDULE_CHUNK):
            chunk = refs[start : start + SCHEDULE_CHUNK]
            await self.app.aschedule_many(task, chunk, revisit=True, backend=backend)
        return ReprocessResult(stage=stage, scheduled=len(refs), stages=names, worker=None)

    def run_finish(self) -> Any:
        return None if self._finish is None else self._finish(self.results)


async def _refuse_busy_queues(
    backend: Backend, queues: Sequence[str], heartbeat: Heartbeat, own: str
) -> None:
    found = await busy(backend, queues, heartbeat=heartbeat, ignore=own)
    if found:
        raise ConfigError(
            f"{len(found)} worker(s) serve queue(s) {', '.join(queues)} ({'; '.join(found[:5])}):"
            " they would run part of the reprocess with the code they loaded. Stop them first,"
            " leave the work to them (--no-run), or run beside them anyway (--force)."
            + (
                f" A reprocess that was killed, here or on another machine, counts no more"
                f" {heartbeat.dead_after:g}s after its last heartbeat; --force runs at once."
                if any(f.startswith("reprocess ") for f in found)
                else ""
            )
        )
