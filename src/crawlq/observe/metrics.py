"""Prometheus metrics: what workers measure, and what the backend counts.

Two sources, one `/metrics` page (served by `crawlq dashboard`):

- **from the backend**, read at scrape time (a few rows at any queue size): per-queue element
  counts by state, the busiest groups' backlog, in-flight count and throttling, live
  workers. Right across every machine, since every worker writes to the one backend.
- **from worker processes**: claim latency, task duration and outcomes, start delay, fetch
  status codes and bytes. Kept in prometheus-client's multi-process mode: with
  ``PROMETHEUS_MULTIPROC_DIR`` set for the workers and the dashboard on one machine, each
  worker process writes its values to files there and `/metrics` adds them up. Without it,
  each process keeps its own values.
The folder's upkeep (only live processes' files, plus archives) is metrics_folder.py.
"""

from __future__ import annotations

import atexit
import functools
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.multiprocess import MultiProcessCollector
from prometheus_client.registry import Collector

from ..types import GroupStats, QueueStats, WorkerInfo
from .metrics_folder import fold_dead, fold_lock, hold_alive, retire

MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"

DURATION_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300)
CLAIM_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 5)


@dataclass(frozen=True, slots=True)
class WorkerMetrics:
    """The metrics a worker process updates. One set a process: see :func:`worker_metrics`."""

    claim_seconds: Histogram
    claimed: Counter
    task_seconds: Histogram
    tasks: Counter
    start_delay_seconds: Histogram
    fetch_responses: Counter
    fetch_bytes: Counter
    # Labelled children by label values: `.labels()` costs as much as the update itself, and
    # a worker updates these for every task.
    _children: dict[tuple[str, ...], Any] = field(default_factory=dict)

    def _child(self, metric: Counter | Histogram, *values: str) -> Any:
        key = (metric._name, *values)
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = metric.labels(*values)
        return child

    def started(self, queue: str, delay: float) -> None:
        """An element of `queue` was claimed `delay` seconds after it was due."""
        self._child(self.claimed, queue).inc()
        self._child(self.start_delay_seconds, queue).observe(delay)

    def finished(self, queue: str, outcome: str, seconds: float) -> None:
        """A task run of `queue` ended with `outcome` (done, retry, dead) after `seconds`."""
        self._child(self.tasks, queue, outcome).inc()
        self._child(self.task_seconds, queue, outcome).observe(seconds)

    def record_fetch(self, status: int, size: int) -> None:
        """For fetching code: one response of HTTP `status` and `size` body bytes."""
        self._child(self.fetch_responses, str(status)).inc()
        self.fetch_bytes.inc(size)


@functools.cache
def worker_metrics() -> WorkerMetrics:
    """This process's worker metrics, made on first use and never registered globally (the
    values live in the process, or in the multi-process folder when it is set: then the
    process folds what ended processes left, is known alive from now on, and folds its own
    files at its exit)."""
    folder = multiprocess_dir()
    if folder is None:
        return _new_worker_metrics()
    with fold_lock(folder):
        fold_dead(folder)
        hold_alive(folder)
        made = _new_worker_metrics()  # its files are opened here, after the fold
    atexit.register(retire, folder)
    return made


def _new_worker_metrics() -> WorkerMetrics:
    return WorkerMetrics(
        claim_seconds=Histogram(
            "crawlq_claim_seconds",
            "Time one claim call on the backend took.",
            buckets=CLAIM_BUCKETS,
            registry=None,
        ),
        claimed=Counter(
            "crawlq_claimed_elements",
            "Elements claimed, by queue.",
            ["queue"],
            registry=None,
        ),
        task_seconds=Histogram(
            "crawlq_task_seconds",
            "Run time of a task, by queue and outcome (done, retry, dead).",
            ["queue", "outcome"],
            buckets=DURATION_BUCKETS,
            registry=None,
        ),
        tasks=Counter(
            "crawlq_tasks",
            "Finished task runs, by queue and outcome (done, retry, dead).",
            ["queue", "outcome"],
            registry=None,
        ),
        start_delay_seconds=Histogram(
            "crawlq_start_delay_seconds",
            "Time from an element's due time to its claim, by queue.",
            ["queue"],
            buckets=DURATION_BUCKETS,
            registry=None,
        ),
        fetch_responses=Counter(
            "crawlq_fetch_responses",
            "HTTP responses fetched, by status code.",
            ["status"],
            registry=None,
        ),
        fetch_bytes=Counter(
            "crawlq_fetch_bytes",
            "Body bytes fetched.",
            registry=None,
        ),
    )


def multiprocess_dir() -> str | None:
    folder = os.environ.get(MULTIPROC_ENV)
    return folder if folder and os.path.isdir(folder) else None


@dataclass(frozen=True, slots=True)
class Snapshot:
    """What the backend said at one moment; the dashboard and `/metrics` share it."""

    at: float
    queues: Sequence[QueueStats]
    groups: Sequence[GroupStats]
    workers: Sequence[WorkerInfo]


#: Groups with series of their own in /metrics by default: none. Every host a crawl meets
#: is a group, and the busiest change all the time, so one label value for each would grow
#: Prometheus a series for every host that was ever among them (1,689 groups in 13 scrapes
#: of a 3,000-host crawl). `crawlq dashboard --metrics-groups N` asks for the N busiest.
METRIC_GROUPS = 0


def backend_families(snapshot: Snapshot, groups: int = METRIC_GROUPS) -> list[Metric]:
    """Gauges of one snapshot of the backend: its queues, the groups it read (busiest
    first) counted by why they wait, and series of their own for the first `groups`."""
    now = snapshot.at
    by_state = GaugeMetricFamily(
        "crawlq_queue_elements", "Elements in a queue, by state.", labels=["queue", "state"]
    )
    totals = GaugeMetricFamily(
        "crawlq_queue_total", "Elements queued, delayed or running.", labels=["queue"]
    )
    for q in snapshot.queues:
        totals.add_metric([q.name], q.total)
        for state in ("due", "delayed", "running", "dead"):
            by_state.add_metric([q.name, state], getattr(q, state))
    queued = GaugeMetricFamily(
        "crawlq_group_queued", "Elements waiting in a group (busiest groups).", labels=["group"]
    )
    running = GaugeMetricFamily(
        "crawlq_group_running", "Elements of a group in flight (busiest groups).", labels=["group"]
    )
    throttled = GaugeMetricFamily(
        "crawlq_group_throttled",
        "1 while a group cannot start an element, by reason (blocked, full, interval).",
        labels=["group", "reason"],
    )
    blocked_for = GaugeMetricFamily(
        "crawlq_group_blocked_seconds",
        "Seconds until a blocked group may start again.",
        labels=["group"],
    )
    counts = {"blocked": 0, "full": 0, "interval": 0}
    for rank, g in enumerate(snapshot.groups):
        why = throttle_reason(g, now)
        if why is not None:
            counts[why] += 1
        if rank >= groups:
            continue
        name = g.name or "(none)"
        queued.add_metric([name], g.queued)
        running.add_metric([name], g.running)
        if why is not None:
            throttled.add_metric([name, why], 1)
        if g.blocked_until is not None and g.blocked_until > now:
            blocked_for.add_metric([name], g.blocked_until - now)
    throttled_groups = GaugeMetricFamily(
        "crawlq_groups_throttled",
        "Busiest groups that cannot start an element now, by reason.",
        labels=["reason"],
    )
    for why, n in counts.items():
        throttled_groups.add_metric([why], n)
    workers = GaugeMetricFamily("crawlq_workers", "Live worker processes.")
    workers.add_metric([], len(snapshot.workers))
    in_flight = GaugeMetricFamily(
        "crawlq_worker_running", "Elements a worker holds.", labels=["worker"]
    )
    for w in snapshot.workers:
        in_flight.add_metric([w.id], w.running)
    return [
        totals,
        by_state,
        queued,
        running,
        throttled,
        blocked_for,
        throttled_groups,
        workers,
        in_flight,
    ]


def throttle_reason(group: GroupStats, now: float) -> str | None:
    """Why a group cannot start an element now, or None if it can."""
    if group.blocked_until is not None and group.blocked_until > now:
        return "blocked"
    if group.limit.concurrency is not None and group.running >= group.limit.concurrency:
        return "full"
    if group.next_start is not None and group.next_start > now:
        return "interval"
    return None


class _Families(Collector):
    def __init__(self, families: Iterable[Metric]) -> None:
        self.families = list(families)

    def collect(self) -> Iterable[Metric]:
        return self.families


def exposition(snapshot: Snapshot, groups: int = METRIC_GROUPS) -> bytes:
    """The `/metrics` page: the backend's gauges (`groups`: see backend_families), plus every
    worker process's values when a multi-process folder is set."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Families(backend_families(snapshot, groups)))
    folder = multiprocess_dir()
    if folder is not None:
        registry.register(_Families(processes_families(folder)))
    return generate_latest(registry)


def processes_families(folder: str) -> list[Metric]:
    """The worker processes' values in `folder`, added up, once the dead ones are folded."""
    with fold_lock(folder):
        fold_dead(folder)
        # Not a file a process is creating this moment (empty until prometheus-client sizes it).
        files = [e.path for e in os.scandir(folder) if e.name.endswith(".db") and e.stat().st_size]
        return list(MultiProcessCollector.merge(files))  # type: ignore[no-untyped-call]
