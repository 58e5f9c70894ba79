"""Backend faults: a writer process killed mid-transaction, or the backend crashing under it,
and a check that the store kept every change the writer was told was made.

The writer (`write_forever`, a child process) schedules, claims, acks and fails elements of
one queue in a loop. Around every call it appends to a journal: the call and its keys before
(`+schedule [...]`), `ok` once the call returned. So after a crash, every key of a completed
schedule must still be queued, unless a completed ack finished it; the one call a kill cut
short may have happened or not. An acked element still there with the attempt that was acked
lost its ack; one claimed again since was acked too late (its lease had run out, so the ack
was refused as stale, by design).

    with WriterPool() as pool:                       # forks writers cheaply
        process = pool.start(url, journal, seed)
        ...; process.kill()
        report = verify_journals(url, [journal])     # what was lost
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import itertools
import json
import multiprocessing
import multiprocessing.context
import os
import random
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from ..backends import Backend, open_backend
from ..errors import BackendError, CrawlqError
from ..tasks import prepare
from ..types import Claimed, Failure, QueueConfig, Schedule
from .redis_server import RedisServer

T = TypeVar("T")

QUEUE = QueueConfig(name="faults")
#: Short, so that what a killed writer held comes back to the next one quickly.
LEASE = 0.5
#: A writer that meets an unreachable backend (Redis restarting) tries again this often.
RETRY_PAUSE = 0.05
#: Lookups in flight at once when a journal is checked.
LOOKUPS_AT_ONCE = 200


# -- the writer -----------------------------------------------------------------------------


def write_forever(url: str, journal: str, seed: int, pause: float = 0.0) -> None:
    """The writer's entry point: runs until killed, resting `pause` seconds each round."""
    asyncio.run(_write_forever(url, journal, seed, pause))


async def _retrying(call: Callable[[], Awaitable[T]]) -> T:
    while True:
        try:
            return await call()
        except BackendError:
            await asyncio.sleep(RETRY_PAUSE)


async def _write_forever(url: str, journal: str, seed: int, pause: float) -> None:
    rng = random.Random(seed)
    fd = os.open(journal, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    def note(line: str) -> None:
        os.write(fd, (line + "\n").encode())

    backend = open_backend(url)
    await _retrying(backend.open)
    await _retrying(lambda: backend.ensure_queues([QUEUE]))
    note("ok")  # ready
    n = 0
    worker = f"writer-{seed}"
    while True:
        items = [
            prepare(QUEUE, f"http://h{rng.randrange(20)}.test/{seed}/{n + i}", due=backend.now())
            for i in range(rng.randint(1, 50))
        ]
        n += len(items)
        note("+schedule " + json.dumps([item.key for item in items]))
        await _retrying(functools.partial(backend.schedule, items))
        note("ok")
        limit = rng.randint(1, 40)
        note("+claim []")
        claim = functools.partial(backend.claim, [QUEUE.name], worker=worker, lease=LEASE)
        result = await _retrying(functools.partial(claim, limit=limit))
        note("ok")
        claimed = result.elements
        acked, failed = _split(claimed, rng)
        note("+ack " + json.dumps([[c.key, c.attempt] for c in acked]))
        await _retrying(functools.partial(backend.ack, acked))
        note("ok")
        failures = [Failure(element=c, error="again", retry_at=backend.now()) for c in failed]
        note("+fail []")
        await _retrying(functools.partial(backend.fail, failures))
        note("ok")  # the rest stay leased, as a killed worker's would
        await asyncio.sleep(pause)


def _split(claimed: list[Claimed], rng: random.Random) -> tuple[list[Claimed], list[Claimed]]:
    """About half acked, a quarter failed (retried at once), a quarter left running."""
    acked = [c for c in claimed if rng.random() < 0.5]
    rest = [c for c in claimed if c not in acked]
    return acked, rest[: len(rest) // 2]


class WriterPool:
    """Writer processes forked from a server that has crawlq imported already, so that each
    costs a fork, not an interpreter start."""

    def __init__(self) -> None:
        self._context = multiprocessing.get_context("forkserver")
        self._context.set_forkserver_preload([__name__])

    def start(
        self, url: str, journal: Path, seed: int, pause: float = 0.0
    ) -> multiprocessing.process.BaseProcess:
        process = self._context.Process(
            target=write_forever, args=(url, str(journal), seed, pause), daemon=True
        )
        process.start()
        return process


# -- what survived --------------------------------------------------------------------------


@dataclass(kw_only=True)
class JournalReport:
    scheduled: int = 0  # keys whose schedule returned
    acked: int = 0  # keys whose ack returned
    lost_schedules: list[str] = field(default_factory=list)  # returned, yet not in the queue
    revived: list[str] = field(default_factory=list)  # acked, yet there with that attempt
    stale: list[str] = field(default_factory=list)  # acked after another claim: refused
    cut_short: str | None = None  # the call the kill interrupted, if any

    def merge(self, other: JournalReport) -> None:
        self.scheduled += other.scheduled
        self.acked += other.acked
        self.lost_schedules += other.lost_schedules
        self.revived += other.revived
        self.stale += other.stale


@dataclass(kw_only=True)
class Journal:
    scheduled: set[str] = field(default_factory=set)
    acked: dict[str, int] = field(default_factory=dict)  # key -> the attempt acked last
    uncertain: set[str] = field(default_factory=set)  # keys of the call cut short
    cut_short: str | None = None
    ready: bool = False
    returned: int = 0  # calls that returned


def read_journal(path: Path) -> Journal:
    journal = Journal()
    pending: tuple[str, list[Any]] | None = None
    text = path.read_text() if path.exists() else ""
    for line in text.splitlines():
        if line == "ok":
            journal.ready = True
            if pending is not None:
                journal.returned += 1
                call, keys = pending
                if call == "schedule":
                    journal.scheduled.update(keys)
                elif call == "ack":
                    journal.acked.update((key, attempt) for key, attempt in keys)
            pending = None
        elif line.startswith("+"):
            call, _, listed = line[1:].partition(" ")
            try:
                pending = (call, json.loads(listed))
            except json.JSONDecodeError:  # the kill tore the line: the call never started
                pending = None
    if pending is not None:
        call, keys = pending
        journal.cut_short = call
        if call == "schedule":
            journal.uncertain.update(keys)
        elif call == "ack":
            journal.uncertain.update(key for key, _ in keys)
    return journal


def verify_journals(url: str, paths: Sequence[Path], *, acks_only: bool = False) -> JournalReport:
    """Looks up every key of the writers' journals in the backend (`acks_only`: the acked
    ones). Writers share the queue, so one may finish what another scheduled: the journals
    are read together."""
    journal = Journal()
    for path in paths:
        one = read_journal(path)
        journal.scheduled |= one.scheduled
        journal.acked.update(one.acked)
        journal.uncertain |= one.uncertain
        journal.cut_short = journal.cut_short or one.cut_short

    async def read(backend: Backend) -> JournalReport:
        report = JournalReport(
            scheduled=len(journal.scheduled),
            acked=len(journal.acked),
            cut_short=journal.cut_short,
        )
        wanted = set(journal.acked) if acks_only else journal.scheduled | set(journal.acked)
        keys = sorted(wanted - journal.uncertain)
        for start in range(0, len(keys), LOOKUPS_AT_ONCE):
            chunk = keys[start : start + LOOKUPS_AT_ONCE]
            found = await asyncio.gather(*(backend.element(QUEUE.name, key) for key in chunk))
            for key, info in zip(chunk, found, strict=True):
                attempt = journal.acked.get(key)
                if attempt is None:
                    if info is None:
                        report.lost_schedules.append(key)
                elif info is not None:
                    (report.revived if info.attempts == attempt else report.stale).append(key)
        return report

    return with_backend(url, read)


def with_backend(url: str, read: Callable[[Backend], Awaitable[T]]) -> T:
    """Runs `read` on a freshly opened backend (an existing store only), from sync code."""

    async def run() -> T:
        backend = open_backend(url, create=False)
        await backend.open()
        try:
            return await read(backend)
        finally:
            await backend.close()

    return asyncio.run(run())


def integrity(path: Path) -> list[str]:
    """SQLite's own check of the file: ["ok"] when sound."""
    with contextlib.closing(sqlite3.connect(path)) as db:
        return [row[0] for row in db.execute("PRAGMA integrity_check")]


def backend_check(url: str) -> list[str]:
    async def read(backend: Backend) -> list[str]:
        return await backend.check()

    return with_backend(url, read)


# -- killing writers ------------------------------------------------------------------------


@dataclass(kw_only=True)
class KillReport:
    kills: int = 0
    inside_calls: int = 0  # kills that cut a backend call short
    journal: JournalReport = field(default_factory=JournalReport)
    corrupt: list[str] = field(default_factory=list)  # integrity_check answers other than ok
    problems: list[str] = field(default_factory=list)  # Backend.check() after a kill
    seconds: float = 0.0


def kill_writers(
    url: str, workdir: Path, *, kills: int, seed: int = 1, max_delay: float = 0.04
) -> KillReport:
    """Starts a writer, lets it make 1..8 calls and then run for a random 0..`max_delay`
    seconds more, SIGKILLs it; then checks the file (SQLite), the store and the journal.
    `kills` times, each writer going on from what the last one left. (The calls first: on a
    starved machine a writer does little within `max_delay` alone.)"""
    rng = random.Random(seed)
    pool = WriterPool()
    database = Path(url.removeprefix("sqlite:///")) if url.startswith("sqlite:") else None
    report = KillReport()
    began = time.monotonic()
    for n in range(kills):
        journal = workdir / f"journal-{n}.txt"
        process = pool.start(url, journal, seed * 100_000 + n)
        deadline = time.monotonic() + 60
        calls = rng.randint(1, 8)
        while read_journal(journal).returned < calls:
            if not process.is_alive() or time.monotonic() > deadline:
                raise RuntimeError(f"writer {n} made no {calls} calls (exit {process.exitcode})")
            time.sleep(0.002)
        time.sleep(rng.uniform(0, max_delay))  # where in its loop the kill lands
        process.kill()
        process.join()
        report.kills += 1
        if database is not None:
            report.corrupt += [f"kill {n}: {r}" for r in integrity(database) if r != "ok"]
        found = verify_journals(url, [journal])
        report.inside_calls += found.cut_short is not None
        report.journal.merge(found)
        report.problems += [f"kill {n}: {p}" for p in backend_check(url)]
    report.seconds = time.monotonic() - began
    return report


# -- crashing Redis under writers -----------------------------------------------------------


class Probes:
    """Writers running beside a crawl, whose journals say what a Redis crash lost."""

    def __init__(
        self, url: str, workdir: Path, *, count: int = 2, seed: int = 1, pause: float = 0.02
    ) -> None:
        self.url = url
        self.journals = [workdir / f"probe-{n}.txt" for n in range(count)]
        pool = WriterPool()
        self.processes = [
            pool.start(url, journal, seed * 1000 + n, pause)
            for n, journal in enumerate(self.journals)
        ]
        deadline = time.monotonic() + 60
        while not all(read_journal(j).ready for j in self.journals):
            if time.monotonic() > deadline:
                raise RuntimeError("the probe writers did not start")
            time.sleep(0.01)

    def signal(self, sig: signal.Signals) -> None:
        for process in self.processes:
            if process.pid is not None and process.is_alive():
                os.kill(process.pid, sig)

    def verify(self, *, acks_only: bool = False) -> JournalReport:
        return verify_journals(self.url, self.journals, acks_only=acks_only)

    def close(self) -> None:
        self.signal(signal.SIGCONT)
        for process in self.processes:
            process.kill()
            process.join()


@dataclass(kw_only=True)
class CrashReport:
    crashes: int = 0
    down: float = 0.0  # seconds from the kill to the restarted server answering
    lost_schedules: set[str] = field(default_factory=set)  # acknowledged, gone after a crash
    revived: set[str] = field(default_factory=set)  # acknowledged acks a crash undid
    stale: set[str] = field(default_factory=set)  # acks refused: the lease had run out
    scheduled: int = 0  # acknowledged schedules of the probes in all
    acked: int = 0


def crash_redis(server: RedisServer, probes: Probes, report: CrashReport) -> None:
    """SIGKILLs redis-server (a crash: only what reached its append-only file survives),
    starts it again on the same files, and notes which acks the probes were told were done
    came undone (checked at once: the element could be finished again later). The probes
    are paused meanwhile. Lost schedules stay lost (keys are never used again), so
    `finish_probes` counts them at the end."""
    began = time.monotonic()
    server.stop(kill=True)
    probes.signal(signal.SIGSTOP)
    try:
        server.start()
        report.down += time.monotonic() - began
        found = probes.verify(acks_only=True)
    finally:
        probes.signal(signal.SIGCONT)
    report.crashes += 1
    report.revived.update(found.revived)
    report.stale.update(found.stale)


def finish_probes(probes: Probes, report: CrashReport) -> None:
    """Stops the probes and counts the acknowledged schedules that are gone."""
    probes.signal(signal.SIGSTOP)
    found = probes.verify()
    probes.close()
    report.lost_schedules.update(found.lost_schedules)
    report.stale.update(found.stale)
    report.scheduled, report.acked = found.scheduled, found.acked


# -- a full disk ----------------------------------------------------------------------------


@contextlib.contextmanager
def small_disk(folder: Path, size: str = "2m") -> Iterator[Path]:
    """A tmpfs of `size` mounted on `folder` (needs root); unmounted on the way out. Raises
    when it cannot be mounted: a caller that needs it must fail, not skip."""
    folder.mkdir(parents=True, exist_ok=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(folder)], check=True)
    try:
        yield folder
    finally:
        subprocess.run(["umount", "--lazy", str(folder)], check=True)


def disk_schedules(backend: Backend, tag: str, count: int) -> list[Schedule]:
    """`count` elements of about 250 bytes each."""
    return [
        prepare(QUEUE, f"http://h{n % 20}.test/{tag}/{n}/{'x' * 200}", due=backend.now())
        for n in range(count)
    ]


@dataclass(kw_only=True)
class DiskReport:
    added: int = 0  # elements scheduled before the disk was full
    errors: list[str] = field(default_factory=list)  # what each refused schedule said
    cli_code: int = 0  # `crawlq schedule` on the full disk
    cli_stderr: str = ""
    integrity: list[str] = field(default_factory=list)  # on the full disk
    problems: list[str] = field(default_factory=list)  # Backend.check() on the full disk
    total: int = 0  # elements in the queue on the full disk
    added_after: int = 0  # scheduled once space was freed
    claimed_after: int = 0  # claimed and acked then
    problems_after: list[str] = field(default_factory=list)
    integrity_after: list[str] = field(default_factory=list)


async def fill_disk(folder: Path, *, ballast: int = 1024 * 1024) -> DiskReport:
    """Fills `folder` (a small tmpfs) with a queue: batches of 100, then 10, then single
    elements, each until refused; tries `crawlq schedule` on it; checks the file and the
    store; frees `ballast` bytes laid down first, and works on.

    The ballast is half of the test's 2 MB disk: once space is freed, the checkpointer may
    copy the log into the database file first, growing it by about a third of what the
    queue holds (300 KB of 1 MB here), and each write after it appends ~60 KB to the log.
    With a quarter of a 1 MB disk freed, a checkpoint at the wrong moment left too little
    for the claim that follows (once in a loaded CI run)."""
    spare = folder / "ballast"
    spare.write_bytes(bytes(ballast))
    path = folder / "queue.db"
    url = f"sqlite:///{path}"
    report = DiskReport()
    backend = open_backend(url)
    await backend.open()
    try:
        await backend.ensure_queues([QUEUE])
        for size in (100, 10, 1):
            for batch in itertools.count():
                items = disk_schedules(backend, f"{size}-{batch}", size)
                try:
                    report.added += (await backend.schedule(items)).added
                except CrawlqError as exc:
                    report.errors.append(f"{type(exc).__name__}: {exc}")
                    break
        texts = [f"http://cli.test/{n}/{'y' * 200}" for n in range(50)]
        cli = subprocess.run(
            [sys.executable, "-m", "crawlq", "schedule", QUEUE.name, "--text", *texts,
             "--backend", url],
            capture_output=True, text=True, check=False,
        )  # fmt: skip
        report.cli_code, report.cli_stderr = cli.returncode, cli.stderr
        report.integrity = integrity(path)
        report.problems = await backend.check()
        report.total = (await backend.queue_stats([QUEUE.name]))[0].total
        spare.unlink()
        report.added_after = (await backend.schedule(disk_schedules(backend, "after", 20))).added
        claimed = await backend.claim([QUEUE.name], worker="w", limit=10, lease=60)
        await backend.ack(claimed.elements)
        report.claimed_after = len(claimed.elements)
        report.problems_after = await backend.check()
    finally:
        await backend.close()
    report.integrity_after = integrity(path)
    return report
