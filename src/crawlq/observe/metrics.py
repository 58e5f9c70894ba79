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

The folder holds files of live processes only, plus one archive per kind of value: a worker
process that ends (its exit, or the next fold that finds it gone) has its counters, histograms
and summaries added into ``<kind>_archive.db`` and its files removed, its live gauges with them
(prometheus-client's `mark_process_dead`). Who folds, under one flock on FOLD_LOCK: a process
on making its worker metrics (what earlier ones left), the same at its exit (its own files),
and `/metrics` before each merge (whoever died since), so the folder stays small with no
dashboard running, and a scrape never sees a fold half done. A process is alive while it holds
the flock on ``alive_<pid>.lock`` (released by the kernel however it ends, and free of pid
reuse and pid namespaces); a pid with no such file (a process of other code) is alive while
the pid is. A fold writes its archives under temporary names, then a journal of what it
replaces and removes, and only then does both: a fold cut short is finished by the next one,
so that no dead process is added twice or lost.
"""

from __future__ import annotations

import atexit
import contextlib
import fcntl
import functools
import json
import os
import re
from collections.abc import Collection, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.mmap_dict import MmapedDict
from prometheus_client.multiprocess import MultiProcessCollector
from prometheus_client.registry import Collector

from ..types import GroupStats, QueueStats, WorkerInfo

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
        _hold_alive(folder)
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


# -- the multi-process folder: only live processes' files, plus archives (module docstring) ----

FOLD_LOCK = "fold.lock"
JOURNAL = "fold.journal"
#: Kinds of value that add up across processes, so outlive theirs in `<kind>_archive.db`.
ADDED_KINDS = ("counter", "histogram", "summary")
#: A process's file: `<kind>_<pid>.db` or `gauge_<mode>_<pid>.db` (values), `alive_<pid>.lock`.
_PID_FILE = re.compile(r"(?P<kind>[a-z]+)_(?:(?P<mode>[a-z]+)_)?(?P<pid>\d+)\.(?:db|lock)")
_UNFINISHED = ".unfinished"
_alive_lock: list[int] = []  # this process's descriptor holding its alive_<pid>.lock


@contextlib.contextmanager
def fold_lock(folder: str) -> Iterator[None]:
    """The folder's turn to fold or read (exclusive); a fold cut short is finished first."""
    descriptor = os.open(os.path.join(folder, FOLD_LOCK), os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(descriptor, fcntl.LOCK_EX)
        _finish_journal(folder)
        yield
    finally:
        os.close(descriptor)


def _alive_path(folder: str, pid: int) -> str:
    return os.path.join(folder, f"alive_{pid}.lock")


def _hold_alive(folder: str) -> None:
    """Marks this process alive for as long as it runs (or until `retire`)."""
    if _alive_lock:
        return
    descriptor = os.open(_alive_path(folder, os.getpid()), os.O_RDWR | os.O_CREAT, 0o644)
    fcntl.flock(descriptor, fcntl.LOCK_EX)
    _alive_lock.append(descriptor)


def _alive(folder: str, pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        descriptor = os.open(_alive_path(folder, pid), os.O_RDWR)
    except FileNotFoundError:
        return _pid_exists(pid)
    try:
        fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(descriptor)
    return False


def _pid_exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's
        return True
    return True


def _files_by_pid(folder: str) -> dict[int, list[str]]:
    found: dict[int, list[str]] = {}
    for name in os.listdir(folder):
        matched = _PID_FILE.fullmatch(name)
        if matched:
            found.setdefault(int(matched["pid"]), []).append(name)
    return found


def fold_dead(folder: str) -> None:
    """Folds the files of every process that is no more. Holding `fold_lock`."""
    files = _files_by_pid(folder)
    _fold(folder, {pid: names for pid, names in files.items() if not _alive(folder, pid)})


def retire(folder: str) -> None:
    """At this process's exit: folds its files, and it is no longer alive."""
    pid = os.getpid()
    if not os.path.isdir(folder):  # removed already: nothing to keep
        return
    with fold_lock(folder):
        _fold(folder, {pid: _files_by_pid(folder).get(pid, [])})
    while _alive_lock:
        os.close(_alive_lock.pop())


def _fold(folder: str, dead: dict[int, list[str]]) -> None:
    """Adds the dead processes' counters, histograms and summaries into the archives, then
    removes their files, their live gauges and alive locks too (their other gauges stay: each
    mode would need its own rule to fold, and crawlq has none). Holding `fold_lock`."""
    added: dict[str, list[str]] = {kind: [] for kind in ADDED_KINDS}
    removed = []
    for name in (name for names in dead.values() for name in names):
        matched = _PID_FILE.fullmatch(name)
        assert matched is not None
        if matched["kind"] in added:
            added[matched["kind"]].append(name)
        if matched["kind"] in (*ADDED_KINDS, "alive") or (matched["mode"] or "").startswith("live"):
            removed.append(name)
    if not removed:
        return
    replaced = {}
    for kind, names in added.items():
        if names:
            archive = f"{kind}_archive.db"
            replaced[archive + _UNFINISHED] = archive
            _write_sum(folder, archive + _UNFINISHED, [archive, *names])
    _write_journal(folder, {"replace": replaced, "remove": removed})
    _finish_journal(folder)


def _write_sum(folder: str, target: str, sources: Iterable[str]) -> None:
    """Writes into `target` the sum of the values of `sources` (those that exist), key by key
    (a key names the metric, the sample and its labels)."""
    totals: dict[str, float] = {}
    for name in sources:
        path = os.path.join(folder, name)
        if not os.path.exists(path):
            continue
        values = MmapedDict.read_all_values_from_file(path)  # type: ignore[no-untyped-call]
        for key, value, _timestamp, _position in values:
            totals[key] = totals.get(key, 0.0) + value
    path = os.path.join(folder, target)
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)
    written = MmapedDict(path)  # type: ignore[no-untyped-call]
    try:
        for key, value in totals.items():
            written.write_value(key, value, 0.0)  # type: ignore[no-untyped-call]
    finally:
        written.close()  # type: ignore[no-untyped-call]
    with open(path, "rb") as synced:
        os.fsync(synced.fileno())


def _write_journal(folder: str, plan: dict[str, Any]) -> None:
    path = os.path.join(folder, JOURNAL)
    with open(path + _UNFINISHED, "w", encoding="utf-8") as journal:
        json.dump(plan, journal)
        journal.flush()
        os.fsync(journal.fileno())
    os.replace(path + _UNFINISHED, path)


def _finish_journal(folder: str) -> None:
    """Does what the journal says (again: each step may have been done), then drops it; with
    no journal, drops what a fold cut short before writing one had begun."""
    path = os.path.join(folder, JOURNAL)
    try:
        with open(path, encoding="utf-8") as journal:
            plan = json.load(journal)
    except FileNotFoundError:
        plan = {"replace": {}, "remove": []}
    for unfinished, archive in plan["replace"].items():
        with contextlib.suppress(FileNotFoundError):
            os.replace(os.path.join(folder, unfinished), os.path.join(folder, archive))
    for name in [*plan["remove"], *_unfinished(folder), JOURNAL]:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(os.path.join(folder, name))


def _unfinished(folder: str) -> Collection[str]:
    return [name for name in os.listdir(folder) if name.endswith(_UNFINISHED)]


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
