"""One worker process: an event loop running many tasks at once over one backend.

The loop claims as many elements as it has free slots, runs each as an asyncio task, and
batches acks and failures. With nothing claimable it sleeps until the next claimable time
the backend reported, a wake-up from another process, or a free slot; it never polls.

Sync tasks run on the worker's own thread pool, a thread for each slot, so none waits for a
thread with its timeout running. Whatever a task raises (sys.exit() and other BaseExceptions
included) fails its element alone; only the worker's own cancellations (a stop, a lapsed
lease) leave an element unrecorded.

A task whose lease lapsed (the process was stopped or starved, or its heartbeats failed, for
longer than the lease) is cancelled: by then the queue may have given its element, and its
group slot, to another worker. The check is a timer at the earliest lease deadline, measured
on this process's monotonic clock from when the claim or the last heartbeat was sent, so it
fires in the first turn of the event loop after a pause, before any task resumes.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import time
import traceback
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from .. import cron
from ..app import App
from ..backends import Backend, base
from ..context import Context
from ..errors import BackendError, BackendUnavailable, ConfigError, Permanent
from ..observe import task_fields, task_scope, worker_metrics
from ..observe.logs import logger, redact, safe_key
from ..tasks import Task, sync_executor
from ..types import Claimed, ClaimResult, Failure, Schedule, WorkerInfo
from ..wakeup import Listener

log = logger("crawlq.worker")

DEFAULT_CONCURRENCY = 200
#: An idle worker still re-checks this often, in case a wake-up datagram was lost.
MAX_IDLE = 30.0
#: A burst worker that waits on other workers' elements re-checks this often.
BURST_RECHECK = 0.5
CLAIM_BATCH = 100
#: The longest pause between claims while the backend cannot be reached.
MAX_OUTAGE_PAUSE = 5.0
#: Claims in a row given back because each found Redis restarted; the next one runs as is.
MAX_RESTARTED_CLAIMS = 3
#: The pause before writing finished elements again after the backend refused them.
FLUSH_RETRY_PAUSE = 1.0


@dataclass(kw_only=True)
class WorkerStats:
    done: int = 0
    failed: int = 0
    dead: int = 0
    released: int = 0
    lapsed: int = 0  # cancelled: the lease ran out before the task finished
    unrecorded: int = 0  # finished, but never written at the stop: they run again
    by_queue: dict[str, int] = field(default_factory=dict)


class Worker:
    """Runs the tasks of `app`; `run()` returns when stopped, or when idle in burst mode."""

    def __init__(
        self,
        app: App,
        *,
        queues: list[str] | None = None,
        concurrency: int = DEFAULT_CONCURRENCY,
        burst: bool = False,
        burst_horizon: float = 60.0,
        grace: float = 30.0,
        name: str | None = None,
    ) -> None:
        names = queues or list(app.tasks)
        unknown = [q for q in names if q not in app.tasks]
        if unknown:
            raise ConfigError(f"no task for queue(s) {', '.join(unknown)} in {app!r}")
        if not names:
            raise ConfigError(f"{app!r} has no tasks to run")
        if concurrency < 1:
            raise ConfigError(f"concurrency must be at least 1, got {concurrency}")
        self.app = app
        self.queues = names
        self.tasks: dict[str, Task[Any]] = {q: app.tasks[q] for q in names}
        self.concurrency = concurrency
        self.burst = burst
        self.burst_horizon = burst_horizon
        self.grace = grace
        #: Each queue's lease, its task's: a crash makes a short task's element wait its own
        #: lease before it runs again, not the longest of the worker's tasks'.
        self.leases = {queue: task.options.lease for queue, task in self.tasks.items()}
        self.lease = max(self.leases.values())
        self.id = name or f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"
        self.stats = WorkerStats()
        self._stop = asyncio.Event()
        self._hurry = asyncio.Event()
        self._stopping = False
        self._inflight: dict[asyncio.Task[None], Claimed] = {}
        self._deadlines: dict[asyncio.Task[None], float] = {}  # loop time the lease runs out
        self._lapsed: set[asyncio.Task[None]] = set()
        self._watchdog: asyncio.TimerHandle | None = None
        self._freed = asyncio.Event()  # a task ended: its slot is free
        # finished elements were written: their groups' slots are free in the queue
        self._changed = asyncio.Event()
        self._acks: list[Claimed] = []
        self._follow: list[Schedule] = []  # written just before the acks (schedule_with_ack)
        self._failures: list[Failure] = []
        self._flush_wanted = asyncio.Event()
        self._closing = False
        self._closing_deadline = 0.0  # monotonic time the final writes are given up at
        self._flushes = 0
        self._flushing = False
        self._recording: list[Claimed] = []  # the batch being written, heartbeated meanwhile
        self._outputs_lost: Exception | None = None  # a shared resource's failed sync
        self._metrics = worker_metrics()

    @property
    def outputs_lost(self) -> Exception | None:
        """Why the worker stopped on its own: its tasks' outputs could not be put on disk."""
        return self._outputs_lost

    def stop(self) -> None:
        """Graceful stop: claim nothing more, let running tasks finish within the grace period.
        Called again (a second Ctrl-C): hurry, running tasks go back to the queue at once."""
        if self._stopping:
            log.info("worker %s hurrying: running tasks go back to the queue now", self.id)
            self._hurry.set()
        else:
            log.info(
                "worker %s stopping: %d running tasks get %gs to finish",
                self.id,
                len(self._inflight),
                self.grace,
            )
        self._stopping = True
        self._stop.set()

    def install_signal_handlers(self) -> None:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self.stop)

    async def run(self) -> WorkerStats:
        threads = ThreadPoolExecutor(self.concurrency, thread_name_prefix="crawlq-task")
        # Set once here: each task's context is a copy of this one, so none needs a set of
        # its own (a write to a context var copies the context's mapping).
        token = sync_executor.set(threads)
        try:
            return await self._run()
        finally:
            sync_executor.reset(token)
            # Not waited for: a sync task cancelled at the stop (its element back in the
            # queue) cannot be interrupted, and finishes on its own.
            threads.shutdown(wait=False, cancel_futures=True)

    async def _run(self) -> WorkerStats:
        backend = await self.app.backend()
        listener = await backend.listen(self.queues)
        info = WorkerInfo(
            id=self.id,
            host=socket.gethostname(),
            pid=os.getpid(),
            queues=tuple(self.queues),
            started=backend.now(),
            heartbeat=backend.now(),
            wake_address=listener.address,
            concurrency=self.concurrency,
        )
        await backend.register_worker(info)
        await cron.plant(self.tasks.values(), backend)
        heartbeats = asyncio.create_task(
            self._heartbeats(backend, info), name=f"crawlq-heartbeat-{self.id}"
        )
        flusher = asyncio.create_task(self._flusher(backend), name=f"crawlq-flusher-{self.id}")
        log.info("worker %s started on %s: queues %s", self.id, backend.url, ",".join(self.queues))
        try:
            await self._claim_loop(backend, listener)
            await self._drain(backend)
        finally:
            # The flusher is never cancelled: a cancelled call can drop a write queued for the
            # backend's thread, and with it acks already taken from the buffer.
            self._closing = True
            self._closing_deadline = time.monotonic() + self.grace
            self._flush_wanted.set()
            await flusher
            if self._watchdog is not None:
                self._watchdog.cancel()
            heartbeats.cancel()
            await asyncio.gather(heartbeats, return_exceptions=True)
            await self._unregister(backend)
            await listener.close()
            await self.app.close_shared()
            log.info("worker %s stopped: %s", self.id, self.stats)
        return self.stats

    async def _claim_loop(self, backend: Backend, listener: Listener) -> None:
        outage_pause = 0.1
        outage = _Outage(self.id, "claims")
        restarts = 0  # claims in a row that found Redis restarted
        while not self._stop.is_set():
            free = self.concurrency - len(self._inflight)
            if free <= 0:
                self._freed.clear()
                await self._wait_any([self._freed, self._stop], None)
                continue
            # Cleared before the claim, so whatever happens from here on wakes the wait below.
            listener.event.clear()
            self._changed.clear()
            want = min(free, CLAIM_BATCH)
            flushes = self._flushes
            try:
                epoch = backend.epoch
                await self.app.published(backend)
                asked = time.perf_counter()
                sent = asyncio.get_running_loop().time()
                result = await backend.claim(
                    self.queues, worker=self.id, limit=want, lease=self.leases
                )
                self._metrics.claim_seconds.observe(time.perf_counter() - asked)
                if backend.epoch != epoch and await self._gave_back(backend, result, restarts):
                    await self._wait_any([self._stop], min(MAX_OUTAGE_PAUSE, 0.05 * restarts))
                    restarts += 1
                    continue
                restarts = 0
            except BackendError as exc:
                # A backend that went away (Redis restarting): keep running tasks, retry.
                outage.failed(exc, "claim")
                await self._wait_any([self._stop], min(MAX_OUTAGE_PAUSE, outage_pause))
                outage_pause *= 2
                continue
            outage.ended()
            outage_pause = 0.1
            for claimed in result.elements:
                self._start(backend, claimed, sent + self.leases[claimed.queue])
            self._arm_watchdog()
            if len(result.elements) == want:
                continue
            now = backend.now()
            timeout = MAX_IDLE if result.next_at is None else max(0.0, result.next_at - now)
            # The claim decided on the queue as it was: only trust its `next_at` for an exit
            # if no finished element was written meanwhile.
            settled = flushes == self._flushes and not (
                self._flushing or self._acks or self._failures
            )
            if self.burst and settled and not self._inflight and not result.elements:
                if await self._burst_done(backend, result.next_at, now) and backend.epoch == epoch:
                    return
                timeout = min(timeout, BURST_RECHECK)
            # A partial claim took everything claimable: like an empty one, it waits for more
            # (events were cleared before it, so nothing that came meanwhile is missed).
            await self._wait_any(
                [listener.event, self._changed, self._stop], min(timeout, MAX_IDLE)
            )

    async def _gave_back(self, backend: Backend, result: ClaimResult, restarts: int) -> bool:
        """The claim found Redis back from a crash that may have lost the queues and limit
        rules it decided by: its elements go back, to be claimed again once they are stored
        again. Not after many such claims in a row (a server flapping), nor when the release
        fails: then they run as claimed."""
        if restarts >= MAX_RESTARTED_CLAIMS:
            return False
        if not result.elements:
            return True
        try:
            await backend.release(result.elements)
        except BackendError as exc:
            log.warning("worker %s: could not give back a claim (%s); running it", self.id, exc)
            return False
        return True

    async def _burst_done(self, backend: Backend, next_at: float | None, now: float) -> bool:
        """Done when nothing in these queues runs anywhere and nothing can start soon: due
        elements of a blocked or slow group wait like delayed ones."""
        stats = await backend.queue_stats(self.queues)
        if any(s.running for s in stats):
            return False
        return next_at is None or next_at > now + self.burst_horizon

    async def _wait_any(self, events: list[asyncio.Event], timeout: float | None) -> None:
        waiters = [asyncio.ensure_future(e.wait()) for e in events]
        try:
            await asyncio.wait(waiters, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for waiter in waiters:
                waiter.cancel()

    def _start(self, backend: Backend, claimed: Claimed, deadline: float) -> None:
        self._metrics.started(claimed.queue, max(0.0, claimed.claimed_at - claimed.due))
        task = asyncio.create_task(
            self._run_one(backend, claimed), name=f"crawlq:{claimed.queue}:{claimed.key[:80]}"
        )
        self._inflight[task] = claimed
        self._deadlines[task] = deadline
        task.add_done_callback(self._finished)

    def _finished(self, task: asyncio.Task[None]) -> None:
        self._inflight.pop(task, None)
        self._deadlines.pop(task, None)
        self._lapsed.discard(task)
        self._freed.set()

    def _arm_watchdog(self) -> None:
        """Sets the lease timer to the earliest deadline of the running tasks."""
        when = min(self._deadlines.values(), default=None)
        if self._watchdog is not None:
            if when is not None and self._watchdog.when() == when:
                return
            self._watchdog.cancel()
            self._watchdog = None
        if when is not None:
            self._watchdog = asyncio.get_running_loop().call_at(when, self._leases_lapsed)

    def _leases_lapsed(self) -> None:
        """A plain callback, not a task: it runs in the loop turn that finds it due, so the
        tasks it cancels take no further step with a lease that is gone."""
        self._watchdog = None
        now = asyncio.get_running_loop().time()
        for task, deadline in list(self._deadlines.items()):
            if deadline <= now:
                self._lapse(task, now - deadline)
                task.cancel()
        self._arm_watchdog()

    def _lapse(self, task: asyncio.Task[None], late: float) -> None:
        del self._deadlines[task]
        self._lapsed.add(task)
        claimed = self._inflight[task]
        self.stats.lapsed += 1
        log.warning(
            "worker %s: lease of %s %s (attempt %d) ran out %.1fs ago; dropped it,"
            " the queue gives it to another worker",
            self.id,
            claimed.queue,
            safe_key(claimed.key),
            claimed.attempt,
            late,
        )

    async def _run_one(self, backend: Backend, claimed: Claimed) -> None:
        began = time.perf_counter()
        ran = False
        try:
            fields = task_fields(
                queue=claimed.queue,
                key=claimed.key,
                attempt=claimed.attempt,
                group=claimed.group,
                worker=self.id,
            )
            with task_scope(fields):
                outcome = await self._run_scoped(backend, claimed)
                ran = True
        except Exception as exc:
            if ran:
                raise
            # crawlq's own code around the task failed (the task's errors are caught inside):
            # left leased, the element would come back after its lease on every worker and
            # fail the same way, never reaching its attempt limit.
            log.exception(
                "worker %s: crawlq failed around %s %s",
                self.id,
                claimed.queue,
                safe_key(claimed.key),
            )
            error, tb = f"crawlq error: {type(exc).__name__}: {exc}", traceback.format_exc()
            try:
                retry_at = self._retry_at(backend, claimed)
            except Exception:
                retry_at = None  # dead letter: it says what failed
            self._fail(claimed, error, tb, retry_at)
            return
        if outcome is not None:
            self._metrics.finished(claimed.queue, outcome, time.perf_counter() - began)

    def _retry_at(self, backend: Backend, claimed: Claimed) -> float | None:
        """When the element runs again after this attempt failed: None if never (dead)."""
        policy = self.tasks[claimed.queue].options.retry
        if policy.exhausted(claimed.attempt):
            return None
        return backend.now() + policy.delay(claimed.attempt)

    async def _run_scoped(self, backend: Backend, claimed: Claimed) -> str | None:
        """Runs one element; its outcome (done, retry, dead), or None if it did not run."""
        me = asyncio.current_task()
        deadline_at = self._deadlines.get(me) if me is not None else None
        now = asyncio.get_running_loop().time()
        if me is not None and deadline_at is not None and deadline_at <= now:
            # The claim came back after its lease ran out (paused in between): the task's
            # first step runs before the lease timer could stop it, so it looks here.
            self._lapse(me, now - deadline_at)
            return None
        task = self.tasks[claimed.queue]
        policy = task.options.retry
        if claimed.attempt > policy.max_attempts:
            reason = (
                f"attempt {claimed.attempt} is past the task's max_attempts "
                f"({policy.max_attempts}): the last one's lease expired (its worker was lost), "
                "or max_attempts was lowered"
            )
            self._fail(claimed, reason, "", None)
            return "dead"
        deadline = asyncio.timeout(None)
        try:
            element = json.loads(claimed.payload)
            ctx = Context(self.app, backend, claimed, element)
            async with asyncio.timeout(task.options.timeout) as deadline:
                await task.run(ctx, element)
        except BaseException as exc:
            # Cancelled by the worker (stopping, the lease lost): not the task's failure. Any
            # other exception, a CancelledError the task raised itself or a BaseException such
            # as sys.exit() in its code included, fails this element alone.
            if isinstance(exc, asyncio.CancelledError) and me is not None and me.cancelling():
                if self._stopping and me not in self._lapsed:
                    await backend.release([claimed])
                    self.stats.released += 1
                raise
            error = _error_of(exc)
            if deadline.expired():
                error = f"timed out after {task.options.timeout}s"
            retry_at = None if isinstance(exc, Permanent) else self._retry_at(backend, claimed)
            log.warning("%s failed: %s", task.name, error)
            self._fail(claimed, error, "".join(traceback.format_exception(exc)), retry_at)
            return "dead" if retry_at is None else "retry"
        else:
            self._follow += ctx.with_ack
            self._acks.append(claimed)
            self.stats.done += 1
            self.stats.by_queue[claimed.queue] = self.stats.by_queue.get(claimed.queue, 0) + 1
            self._flush_wanted.set()
            return "done"

    def _fail(self, claimed: Claimed, error: str, tb: str, retry_at: float | None) -> None:
        # Masked as stored: the error and traceback of an exception may quote a credential
        # (a URL's, a header's), and every reader of the queue shows them (crawlq dead
        # --json, the dashboard, the API); the element's own payload is kept as given.
        failure = Failure(
            element=claimed, error=redact(error), traceback=redact(tb), retry_at=retry_at
        )
        self._failures.append(failure)
        self.stats.failed += 1
        if retry_at is None:
            self.stats.dead += 1
        self._flush_wanted.set()

    async def _flusher(self, backend: Backend) -> None:
        """Writes finished elements in batches, until the worker closes and all is written, or
        the writes still fail once closing is past its deadline or hurried."""
        outage = _Outage(self.id, "records of finished elements")
        while not (self._closing and not self._acks and not self._failures):
            await self._flush_wanted.wait()
            self._flush_wanted.clear()
            try:
                await self._flush(backend)
            except Exception as exc:
                if self._closing and self._past_closing_deadline():
                    self._give_up_writes()
                    return
                outage.failed(exc, "recording finished elements")
                await self._flush_retry_pause()
                self._flush_wanted.set()
                continue
            outage.ended()

    def _past_closing_deadline(self) -> bool:
        return self._hurry.is_set() or time.monotonic() >= self._closing_deadline

    async def _flush_retry_pause(self) -> None:
        if self._closing:  # a second stop ends the retries at once
            await self._wait_any([self._hurry], FLUSH_RETRY_PAUSE)
        else:
            await asyncio.sleep(FLUSH_RETRY_PAUSE)

    def _give_up_writes(self) -> None:
        """At-least-once: elements never acknowledged, or never failed, are still leased to
        this worker in the queue, which gives them out again once their leases expire."""
        acks, failures = len(self._acks), len(self._failures)
        self.stats.unrecorded = acks + failures
        log.exception(
            "worker %s stopping: gave up recording %d finished and %d failed elements in the"
            " backend; they run again once their leases expire (within %.0fs)",
            self.id,
            acks,
            failures,
            self.lease,
        )

    async def _unregister(self, backend: Backend) -> None:
        """Best effort: a worker whose backend cannot be written leaves its registration to
        lapse with its heartbeats."""
        if self.stats.unrecorded:
            return
        try:
            await backend.unregister_worker(self.id)
        except BackendError as exc:
            log.warning("worker %s could not unregister (%s)", self.id, exc)

    async def _flush(self, backend: Backend) -> None:
        acks, self._acks = self._acks, []
        follow, self._follow = self._follow, []
        failures, self._failures = self._failures, []
        self._flushing = True
        # Its leases are still renewed: syncing outputs may wait on a lock another process
        # holds (a SIGSTOPped one), and the batch must not lapse meanwhile.
        self._recording = [*acks, *(f.element for f in failures)]
        try:
            if acks or failures:
                follow, acks, failures = await self._synced(backend, follow, acks, failures)
            await backend.finish(follow, acks, failures)
            self._flushes += 1
            self._changed.set()
        except BaseException:
            self._follow[:0] = follow
            self._acks[:0] = acks
            self._failures[:0] = failures
            raise
        finally:
            self._flushing = False
            self._recording = []

    async def _synced(
        self, backend: Backend, follow: list[Schedule], acks: list[Claimed], failures: list[Failure]
    ) -> tuple[list[Schedule], list[Claimed], list[Failure]]:
        """The batch, once what its tasks wrote through the app's shared resources is on disk
        (`App.sync_shared`). A failed sync may have lost the outputs of any task, those still
        running included (and the next one could succeed: Linux reports such an error once),
        so the worker stops at once, its running tasks going back to the queue, and every
        element it finishes from then on fails instead of being done, to run again by its
        retry policy, without the follow-up work that would have come with its ack."""
        if self._outputs_lost is None:
            try:
                await self.app.sync_shared()
                return follow, acks, failures
            except Exception as exc:
                log.exception("worker %s could not put its tasks' outputs on disk", self.id)
                self._outputs_lost = exc
                self._stopping = True
                self._stop.set()
                self._hurry.set()
        lost = self._outputs_lost
        error = redact(f"crawlq error: outputs not on disk: {type(lost).__name__}: {lost}")
        failed = [
            Failure(element=c, error=error, retry_at=self._retry_at(backend, c)) for c in acks
        ]
        for claimed in acks:
            self.stats.by_queue[claimed.queue] -= 1
        self.stats.done -= len(failed)
        self.stats.failed += len(failed)
        self.stats.dead += sum(f.retry_at is None for f in failed)
        return [], [], [*failures, *failed]

    async def _heartbeats(self, backend: Backend, info: WorkerInfo) -> None:
        # three beats a lease, and a worker of hour-long leases still beats three times
        # within the silence after which the backend forgets it
        interval = max(0.05, min(*self.leases.values(), base.WORKER_TTL) / 3)
        loop = asyncio.get_running_loop()
        registered = backend.epoch
        replant_at = loop.time() + cron.REPLANT_EVERY
        outage = _Outage(self.id, "heartbeats")
        while True:
            await asyncio.sleep(interval)
            if backend.epoch != registered:  # a Redis back from a crash may have lost it
                try:
                    await backend.register_worker(info)
                    await cron.plant(self.tasks.values(), backend)  # and the cron triggers
                    registered = backend.epoch
                except Exception as exc:
                    outage.failed(exc, "registering again")
            elif loop.time() >= replant_at:
                replant_at = loop.time() + cron.REPLANT_EVERY
                try:
                    await cron.plant(self.tasks.values(), backend)
                except Exception as exc:
                    outage.failed(exc, "planting cron triggers again")
            running = [t for t in self._inflight if t not in self._lapsed]
            pending = [
                *(self._inflight[t] for t in running),
                *self._acks,
                *(f.element for f in self._failures),
                *self._recording,
            ]
            sent = loop.time()
            try:
                await backend.heartbeat(info, pending, self.leases)
            except Exception as exc:
                outage.failed(exc, "heartbeat")
                continue
            outage.ended()
            for task in running:
                if task in self._deadlines:
                    self._deadlines[task] = sent + self.leases[self._inflight[task].queue]
            self._arm_watchdog()

    async def _drain(self, backend: Backend) -> None:
        """Stopping: running tasks get the grace period, then go back to the queue at once."""
        if not self._inflight:
            return
        running = list(self._inflight)
        # Tasks the last claim just created take their first step: cancelled before it, a task
        # never runs the code that gives its element back, which would wait out its lease.
        await asyncio.sleep(0)
        deadline = time.monotonic() + self.grace
        while self._inflight and not self._hurry.is_set():
            left = deadline - time.monotonic()
            if left <= 0:
                break
            self._freed.clear()
            await self._wait_any([self._freed, self._hurry], left)
        for task in running:
            task.cancel()
        await asyncio.gather(*running, return_exceptions=True)


#: A backend that cannot be reached: not a bug, and no traceback would help.
_UNREACHABLE = (BackendUnavailable, ConnectionError, TimeoutError)


class _Outage:
    """One of a worker's loops (heartbeats, claims, records of finished elements) while the
    backend cannot be reached (Redis stopped, restarting, cut off): one WARNING as its calls
    start failing, with the reason, and one INFO once one succeeds again; the calls failing
    meanwhile at DEBUG. They logged a line, or a traceback, at each try. Any other error is
    logged with its traceback each time: that is a bug to see."""

    def __init__(self, worker: str, what: str) -> None:
        self.worker = worker
        self.what = what  # plural: "... succeed again"
        self.since: float | None = None  # time.monotonic() of the first failure
        self.failures = 0

    def failed(self, exc: Exception, doing: str) -> None:
        if not isinstance(exc, _UNREACHABLE):
            log.error("worker %s: %s failed; retrying", self.worker, doing, exc_info=exc)
            return
        self.failures += 1
        if self.since is None:
            self.since = time.monotonic()
            log.warning(
                "worker %s: %s failed, the backend unreachable: %s; retrying, quietly until "
                "%s succeed again",
                self.worker,
                doing,
                exc,
                self.what,
            )
        else:
            log.debug("worker %s: %s failed again: %s", self.worker, doing, exc)

    def ended(self) -> None:
        """A call succeeded."""
        if self.since is None:
            return
        log.info(
            "worker %s: %s succeed again, after %d failed in %.1f s",
            self.worker,
            self.what,
            self.failures,
            time.monotonic() - self.since,
        )
        self.since = None
        self.failures = 0


def _error_of(exc: BaseException) -> str:
    """How a task's exception is recorded: its type and message, even if its str() fails."""
    try:
        message = str(exc)
    except Exception as failed:
        message = f"<str() raised {type(failed).__name__}>"
    return f"{type(exc).__name__}: {message}" if message else type(exc).__name__
