"""Shared measurement for every benchmarked system (crawlq and its peers).

Completion is counted the same way everywhere: each task, when it finishes, appends
exactly one byte to a marker file (`mark_done`); the harness watches the file grow
(`wait_for_completions`). The rate is taken between the first and the n-th completion,
so worker boot time is left out.

Also here: running worker processes (each in its own process group, always killed on
exit) and sampling the peak RSS of their process trees.
"""

from __future__ import annotations

import math
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import IO

try:
    import psutil
except ImportError:  # pragma: no cover - psutil comes with the bench extra
    psutil = None

#: Worker processes find the marker file here when tasks call ``mark_done()``.
MARKER_ENV = "BENCH_MARKER_FILE"
#: ... and the lateness file here when delayed tasks call ``mark_late(due)``.
LATENESS_ENV = "BENCH_LATENESS_FILE"

_fds: dict[str, int] = {}
_fds_lock = threading.Lock()
os.register_at_fork(after_in_child=_fds.clear)  # a forked worker opens its own


def _marker_fd(path: str) -> int:
    fd = _fds.get(path)
    if fd is None:
        with _fds_lock:
            fd = _fds.get(path)
            if fd is None:
                fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
                _fds[path] = fd
    return fd


def mark_done(path: str | os.PathLike[str] | None = None) -> None:
    """Record one finished task: append one byte to the marker file.

    ``path`` defaults to the file named by the BENCH_MARKER_FILE environment variable.
    The file descriptor is opened once per process and kept (O_APPEND: each write is
    atomic, so threads and processes may share the file); so use a fresh path for each
    run rather than deleting and recreating the same one.
    """
    if path is None:
        path = os.environ[MARKER_ENV]
    os.write(_marker_fd(os.fspath(path)), b".")


def mark_late(due: float) -> None:
    """Record a delayed task's start: its lateness (now - due, in seconds) as one line of the
    lateness file (BENCH_LATENESS_FILE), then one completion (`mark_done`).

    Call it first thing in the task: ``due`` is the wall-clock time (time.time()) the task
    was due at, passed to it as an argument by whoever scheduled it.
    """
    late = time.time() - due
    os.write(_marker_fd(os.environ[LATENESS_ENV]), f"{late:.6f}\n".encode())
    mark_done()


def read_lateness(path: str | os.PathLike[str]) -> list[float]:
    """The latenesses `mark_late` wrote, in seconds, sorted."""
    return sorted(float(line) for line in Path(path).read_text().split())


def percentile(sorted_values: Sequence[float], fraction: float) -> float:
    """Nearest-rank percentile of already sorted values (fraction 0.5 is the median)."""
    if not sorted_values:
        raise ValueError("no values")
    rank = max(1, min(len(sorted_values), math.ceil(fraction * len(sorted_values))))
    return sorted_values[rank - 1]


@dataclass(frozen=True)
class Measurement:
    """Completions seen by `wait_for_completions` (times are time.monotonic())."""

    tasks: int
    t_first: float
    t_last: float

    @property
    def seconds(self) -> float:
        return self.t_last - self.t_first

    @property
    def rate(self) -> float:
        """Tasks per second between the first and the last completion."""
        return (self.tasks - 1) / self.seconds if self.seconds > 0 else float("inf")


class CompletionTimeout(TimeoutError):
    def __init__(self, path: Path, reached: int, expected: int, timeout: float) -> None:
        super().__init__(f"only {reached}/{expected} tasks completed in {timeout:.0f}s ({path})")
        self.reached = reached


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except FileNotFoundError:
        return 0


def wait_for_completions(
    path: str | os.PathLike[str],
    n: int,
    timeout: float,
    *,
    interval: float = 0.002,
    check: Callable[[], None] | None = None,
) -> Measurement:
    """Poll the marker file until it holds ``n`` bytes; time the first and the n-th.

    ``check`` (if given) is called about every 0.25 s and may raise to abort early,
    e.g. when the workers died. Raises CompletionTimeout with the count reached.
    """
    if n < 2:
        raise ValueError("need at least 2 tasks to measure a rate")
    marker = Path(path)
    start = time.monotonic()
    deadline = start + timeout
    next_check = start + 0.25
    t_first: float | None = None
    while True:
        size = _size(marker)
        now = time.monotonic()
        if size and t_first is None:
            t_first = now
        if size >= n:
            assert t_first is not None
            return Measurement(tasks=n, t_first=t_first, t_last=now)
        if now > deadline:
            raise CompletionTimeout(marker, size, n, timeout)
        if check is not None and now >= next_check:
            check()
            next_check = now + 0.25
        time.sleep(interval)


class WorkersDied(RuntimeError):
    pass


class Workers:
    """Worker subprocesses, each the leader of its own process group."""

    def __init__(self, procs: list[subprocess.Popen[bytes]], log: Path) -> None:
        self.procs = procs
        self.log = log

    def check_alive(self) -> None:
        """Raise WorkersDied (with the log's tail) if any worker process has exited."""
        dead = [p for p in self.procs if p.poll() is not None]
        if dead:
            codes = ", ".join(f"{p.args!r} -> {p.returncode}" for p in dead)
            raise WorkersDied(f"worker exited early: {codes}\n{self.log_tail()}")

    def log_tail(self, chars: int = 3000) -> str:
        try:
            return self.log.read_text(errors="replace")[-chars:]
        except OSError:
            return ""

    def stop(self, timeout: float = 5.0) -> None:
        """SIGTERM every process group, then SIGKILL whatever is left after ``timeout``."""
        for proc in self.procs:
            _signal_group(proc, signal.SIGTERM)
        deadline = time.monotonic() + timeout
        for proc in self.procs:
            with suppress(subprocess.TimeoutExpired):
                proc.wait(max(0.0, deadline - time.monotonic()))
        for proc in self.procs:  # also reaps children that outlived their leader
            _signal_group(proc, signal.SIGKILL)
            proc.wait()


def _signal_group(proc: subprocess.Popen[bytes], sig: signal.Signals) -> None:
    with suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, sig)


@contextmanager
def run_workers(
    commands: Sequence[Sequence[str]],
    env: Mapping[str, str],
    log: Path,
    cwd: str | os.PathLike[str] | None = None,
    stop_timeout: float = 5.0,
) -> Iterator[Workers]:
    """Start one subprocess per command (stdout+stderr to ``log``); always stop them all."""
    procs: list[subprocess.Popen[bytes]] = []
    out: IO[bytes] = log.open("ab")
    workers = Workers(procs, log)
    try:
        for cmd in commands:
            procs.append(
                subprocess.Popen(
                    list(cmd),
                    env=dict(env),
                    cwd=cwd,
                    stdin=subprocess.DEVNULL,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            )
        yield workers
    finally:
        workers.stop(stop_timeout)
        out.close()


class PeakRSS:
    """Samples the summed RSS of process trees in a background thread.

    RSS is summed over every process, so pages shared after fork are counted once per
    process: an upper bound for pre-forked pools. ``peak_mb`` is None without psutil.
    """

    def __init__(self, pids: Sequence[int], interval: float = 0.2) -> None:
        self._pids = list(pids)
        self._interval = interval
        self._peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="peak-rss", daemon=True)

    def __enter__(self) -> PeakRSS:
        if psutil is not None:
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()

    @property
    def peak_mb(self) -> float | None:
        return None if psutil is None else self._peak / (1024 * 1024)

    def _run(self) -> None:
        while True:
            self._peak = max(self._peak, sum(_tree_rss(pid) for pid in self._pids))
            if self._stop.wait(self._interval):
                return


def _tree_rss(pid: int) -> int:
    try:
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.Error:
        return 0
    total = 0
    for proc in procs:
        with suppress(psutil.Error):
            total += int(proc.memory_info().rss)
    return total
