"""The multi-process metrics folder: files of live worker processes only, plus archives.

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

import contextlib
import fcntl
import json
import os
import re
from collections.abc import Collection, Iterable, Iterator
from typing import Any

from prometheus_client.mmap_dict import MmapedDict

from ..liveness import pid_exists

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


def hold_alive(folder: str) -> None:
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
        return pid_exists(pid)
    try:
        fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(descriptor)
    return False


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
