"""Worker chaos on a real crawl: several `crawlq crawl` processes share one backend and one
output folder while a synthetic web logs every request; some workers are SIGKILLed at points
set by progress (every k pages the server saw) and replaced, one is SIGSTOPped for longer
than its lease and then continued. The crawl is judged from the server's own log.

    with SyntheticWebThread(sites) as web:
        result = run_worker_chaos(web, plan, url, workdir)

Used by tests/chaos/test_worker_chaos.py (CI size) and benchmarks/chaos_bench.py (full size).
Everything stays on loopback (127.0.1.x), reached through `--resolve` and `--resolve-only`.
"""

from __future__ import annotations

import asyncio
import fcntl
import itertools
import os
import random
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

import psutil
from aiohttp.web import Request, Response, StreamResponse

from ..backends.sqlite.backend import path_from_url
from ..crawl.testing.sites import Hit, Site, SyntheticWeb, page_html
from ..errors import CrawlqError
from ..writelock import SUFFIX
from .faults import with_backend

if TYPE_CHECKING:
    from ..backends import Backend

T = TypeVar("T")

#: How often the controller looks at the server's log and its processes.
POLL = 0.02
#: How often the controller looks at which worker holds which connection (`Connections`).
LOOK_EVERY = 0.5
ROBOTS = "/robots.txt"


class SyntheticWebThread:
    """A `SyntheticWeb` serving from an event loop on a thread of its own, so a synchronous
    controller can start and signal processes while it serves."""

    def __init__(self, sites: list[Site]) -> None:
        self.net = SyntheticWeb(sites)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="synthetic-web", daemon=True)

    def _run(self) -> None:
        async def serve() -> None:
            self._loop = asyncio.get_running_loop()
            self._stop = asyncio.Event()
            async with self.net:
                self._ready.set()
                await self._stop.wait()

        try:
            asyncio.run(serve())
        except BaseException as exc:  # reported by __enter__ or __exit__
            self._error = exc
            self._ready.set()

    def __enter__(self) -> SyntheticWebThread:
        self._thread.start()
        if not self._ready.wait(30) or self._error is not None:
            raise RuntimeError(f"the synthetic web did not start: {self._error!r}")
        return self

    def __exit__(self, *exc: object) -> None:
        if self._loop is not None and self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(30)

    @property
    def hits(self) -> list[Hit]:
        return self.net.hits

    def pages_seen(self) -> int:
        """Page requests that arrived so far (robots.txt left out)."""
        return sum(1 for hit in list(self.net.hits) if hit.path != ROBOTS)

    def seeds(self) -> list[str]:
        return [self.net.url(name) for name in self.net.sites]

    def resolve_args(self) -> list[str]:
        return [arg for name, a in self.net.resolve.items() for arg in ("--resolve", f"{name}={a}")]

    def expected_pages(self) -> set[tuple[str, str]]:
        return {
            (name, f"/page/{n}") for name, site in self.net.sites.items() for n in range(site.pages)
        }


def chaos_sites(count: int, pages: int, latency: float) -> list[Site]:
    """`count` sites of `pages` pages, no robots.txt rules; page 0 of each is a seed."""
    return [Site(name=f"site{n}.test", pages=pages, latency=latency) for n in range(count)]


# -- judging from the server's log --------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class Seen:
    """A request as the server's log has it, and the crawl process that sent it if known."""

    path: str
    at: float  # arrival, epoch seconds
    ended: float | None  # answer ready (None: never answered)
    peer: str  # the client's address
    worker: int | None = None  # the pid of the process that sent it

    @classmethod
    def of(cls, hit: Hit, workers: Mapping[tuple[str, int], int]) -> Seen:
        worker = None if hit.port is None else workers.get((hit.peer, hit.port))
        return cls(path=hit.path, at=hit.at, ended=hit.ended, peer=hit.peer, worker=worker)

    def describe(self, origin: float) -> str:
        """One line, times in seconds from `origin`."""
        end = "never answered" if self.ended is None else f"answered {self.ended - origin:.4f}"
        who = f"pid {self.worker}" if self.worker is not None else f"from {self.peer}"
        return f"{self.path} [arrived {self.at - origin:.4f}, {end}, {who}]"


@dataclass(kw_only=True)
class Violation:
    kind: str  # "concurrency" or "interval"
    host: str
    path: str
    at: float
    detail: str
    robots: bool  # a robots.txt request is one of the two
    request: Seen | None = None  # the request that broke the limit
    overlapping: list[Seen] = field(default_factory=list)  # those it came too soon after

    def describe(self, origin: float) -> str:
        """The violation and every request involved, one line, times from `origin`."""
        if self.request is None:
            return f"{self.kind} {self.host}{self.path}: {self.detail}"
        others = "; ".join(seen.describe(origin) for seen in self.overlapping)
        relation = "while open" if self.kind == "concurrency" else "too soon after"
        return (
            f"{self.kind} at {self.host}: {self.request.describe(origin)} {relation}:"
            f" {others} ({self.detail})"
        )


@dataclass(kw_only=True)
class Verdict:
    requests: int
    pages: int  # distinct pages answered 200
    expected: int
    missing: list[tuple[str, str]]
    duplicates: int  # page requests answered 200 beyond the first, per page
    violations: list[Violation]
    min_gap: float | None
    started: float = 0.0  # the first request's arrival: what `explain` counts times from

    def count(self, kind: str, *, robots: bool | None = None) -> int:
        """Violations of `kind`; with `robots`, only those (not) involving robots.txt."""
        return sum(
            1 for v in self.violations if v.kind == kind and (robots is None or v.robots == robots)
        )

    def explain(self, kind: str, limit: int | None = None) -> list[str]:
        """The violations of `kind`, one line each with the requests involved: in order of
        arrival for concurrency, the shortest gaps first for the interval (at most `limit`)."""
        chosen = [v for v in self.violations if v.kind == kind]
        if kind == "interval":
            chosen.sort(key=_gap_of)
        return [v.describe(self.started) for v in chosen[:limit]]


def _gap_of(violation: Violation) -> float:
    if violation.request is None or not violation.overlapping:
        return 0.0
    return violation.request.at - violation.overlapping[-1].at


def judge(
    hits: Sequence[Hit],
    expected: set[tuple[str, str]],
    *,
    concurrency: int,
    interval: float,
    workers: Mapping[tuple[str, int], int] | None = None,
) -> Verdict:
    """Politeness from the server's side: a request arriving while `concurrency` others to
    its host were unanswered, or less than `interval` seconds after the previous arrival at
    its host (robots.txt requests are requests too). Each violation names the requests
    involved, and the crawl process that sent each where `workers` ((client address, port)
    -> pid) knows it."""
    owners = workers or {}
    by_host: dict[str, list[Hit]] = defaultdict(list)
    for hit in hits:
        by_host[hit.host].append(hit)
    violations: list[Violation] = []
    min_gap: float | None = None
    for rows in by_host.values():
        rows.sort(key=lambda h: h.at)
        still_open: list[Hit] = []
        for hit in rows:
            still_open = [h for h in still_open if h.ended is None or h.ended > hit.at]
            if len(still_open) >= concurrency:
                detail = f"{len(still_open)} requests still open"
                violations.append(_violation("concurrency", hit, still_open, detail, owners))
            still_open.append(hit)
        for earlier, later in itertools.pairwise(rows):
            gap = later.at - earlier.at
            min_gap = gap if min_gap is None else min(min_gap, gap)
            if gap < interval:
                detail = f"{gap * 1000:.1f} ms after {earlier.path}"
                violations.append(_violation("interval", later, [earlier], detail, owners))
    answered = Counter(
        (h.host, h.path) for h in hits if h.status == 200 and h.path != "/robots.txt"
    )
    fetched = set(answered) & expected
    return Verdict(
        requests=len(hits),
        pages=len(fetched),
        expected=len(expected),
        missing=sorted(expected - fetched),
        duplicates=sum(n - 1 for n in answered.values()),
        violations=sorted(violations, key=lambda v: v.at),
        min_gap=min_gap,
        started=min((h.at for h in hits), default=0.0),
    )


def _violation(
    kind: str,
    hit: Hit,
    others: list[Hit],
    detail: str,
    owners: Mapping[tuple[str, int], int],
) -> Violation:
    """`hit` breaking a limit because of `others`; robots.txt is one of them, or not."""
    return Violation(
        kind=kind,
        host=hit.host,
        path=hit.path,
        at=hit.at,
        detail=detail,
        robots=any(h.path == ROBOTS for h in (hit, *others)),
        request=Seen.of(hit, owners),
        overlapping=[Seen.of(h, owners) for h in others],
    )


class Connections:
    """Which crawl process has which connection to the synthetic web, so the judge can name
    the worker behind a request: looked at (psutil) every LOOK_EVERY seconds and right
    before a process is killed. A connection opened and closed between two looks stays
    unnamed."""

    def __init__(self, web: SyntheticWebThread) -> None:
        self.web = web
        self.owners: dict[tuple[str, int], int] = {}  # (client address, port) -> pid
        self._looked = 0.0

    def look(self, pids: Iterable[int], *, now: bool = False) -> None:
        if not now and time.monotonic() - self._looked < LOOK_EVERY:
            return
        self._looked = time.monotonic()
        ports = set(self.web.net.ports.values())
        for pid in pids:
            try:
                connections = psutil.Process(pid).net_connections(kind="tcp")
            except psutil.Error:
                continue
            for conn in connections:
                if conn.raddr and conn.raddr.port in ports:
                    self.owners[(conn.laddr.ip, conn.laddr.port)] = pid


# -- the worker processes -----------------------------------------------------------------


@dataclass(kw_only=True)
class Fleet:
    """`crawlq crawl` processes started from one command line, each logging to a file."""

    command: list[str]
    logs: Path
    env: dict[str, str] | None = None
    running: dict[int, subprocess.Popen[bytes]] = field(default_factory=dict)
    ended: list[subprocess.Popen[bytes]] = field(default_factory=list)
    _numbers: itertools.count[int] = field(default_factory=itertools.count)
    _paths: dict[int, Path] = field(default_factory=dict)
    _tails: dict[int, str] = field(default_factory=dict)

    def start(self) -> int:
        self.logs.mkdir(parents=True, exist_ok=True)
        number = next(self._numbers)
        path = self.logs / f"worker-{number}.log"
        with path.open("wb") as log:
            proc = subprocess.Popen(
                self.command, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                env=self.env, start_new_session=True,
            )  # fmt: skip
        self.running[proc.pid] = proc
        self._paths[proc.pid] = path
        return proc.pid

    def reap(self) -> None:
        for pid, proc in list(self.running.items()):
            if proc.poll() is not None:
                self.ended.append(self.running.pop(pid))
                if proc.returncode:
                    self._tails[pid] = self._paths[pid].read_text(errors="replace")[-800:]

    def signal(self, pid: int, sig: signal.Signals) -> None:
        self.running[pid].send_signal(sig)

    def kill(self, pid: int) -> None:
        proc = self.running.pop(pid)
        proc.kill()
        proc.wait()
        self.ended.append(proc)

    def close(self) -> None:
        for proc in self.running.values():
            proc.kill()
            proc.wait()
        self.ended.extend(self.running.values())
        self.running.clear()

    def failures(self) -> list[str]:
        """Processes that ended on their own with an error, with their log's tail."""
        return [
            f"pid {proc.pid} exited with {proc.returncode}: {self._tails.get(proc.pid, '')}"
            for proc in self.ended
            if proc.returncode not in (0, -signal.SIGKILL)
        ]


def crawl_command(
    web: SyntheticWebThread,
    *,
    backend: str,
    out: Path,
    concurrency: int,
    delay: float,
    lease: float,
    max_attempts: int = 10,
) -> list[str]:
    return [
        sys.executable, "-m", "crawlq", "crawl", *web.seeds(), *web.resolve_args(),
        "--resolve-only", "--allow-network", "127.0.0.0/8", "--backend", backend,
        "--out", str(out), "--concurrency-per-domain", str(concurrency), "--delay", str(delay),
        "--lease", str(lease), "--max-attempts", str(max_attempts), "--retry-delay", "0.2",
        "--timeout", "10", "--no-progress", "--log-level", "WARNING",
    ]  # fmt: skip


# -- the chaos run ------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class ChaosPlan:
    workers: int = 3
    kills: int = 5
    stops: int = 1
    concurrency: int = 2  # per domain
    delay: float = 0.0  # seconds between requests to a host
    lease: float = 3.0
    stop_for: float = 5.0  # seconds a stopped worker stays stopped; more than `lease`
    seed: int = 7
    timeout: float = 600.0

    def events(self, pages: int) -> list[tuple[int, str]]:
        """(pages the server has seen, "kill" or "stop"): evenly spread over the crawl, the
        stops among the kills."""
        total = self.kills + self.stops
        step = max(1, pages // (total + 1))
        stops = {round((n + 0.5) * total / self.stops) for n in range(self.stops)}
        return [(step * (n + 1), "stop" if n in stops else "kill") for n in range(total)]


@dataclass(kw_only=True)
class ChaosResult:
    verdict: Verdict
    kills: int
    stops: int
    started: int  # worker processes in all
    held: int  # elements the killed and stopped workers held: the bound on duplicates
    seconds: float
    problems: list[str]  # from Backend.check() and the final counts
    process_failures: list[str]
    lapsed: int  # "lease ran out" lines in the workers' logs
    stalls: int = 0  # stops that caught their worker holding SQLite's lock or its writer turn


#: Seconds a write must wait for SQLite's lock or the writer turn to count as stalled by a
#: stopped process: a running one's transactions take milliseconds.
STALL_PROBE = 1.0


def run_worker_chaos(
    web: SyntheticWebThread,
    plan: ChaosPlan,
    backend: str,
    workdir: Path,
    *,
    faults: Sequence[tuple[int, Callable[[], object]]] = (),
) -> ChaosResult:
    """Crawls the whole web with `plan.workers` processes at once, killing one (and starting
    a replacement) or stopping one for `plan.stop_for` seconds each time the server has seen
    another share of the pages (`plan.events`), then judges the crawl from the server's log
    and the backend's state. `faults` are more things to do once the server has seen so
    many pages (crash the backend...)."""
    expected = web.expected_pages()
    pending = plan.events(len(expected))
    other_faults = sorted(faults, key=lambda fault: fault[0])
    rng = random.Random(plan.seed)
    command = crawl_command(
        web,
        backend=backend,
        out=workdir / "out",
        concurrency=plan.concurrency,
        delay=plan.delay,
        lease=plan.lease,
    )
    fleet = Fleet(command=command, logs=workdir / "logs", env={**os.environ})
    connections = Connections(web)
    stopped: dict[int, float] = {}  # pid -> when to continue it
    kills = stops = started = held = stalls = 0
    began = time.monotonic()
    try:
        for _ in range(plan.workers):
            fleet.start()
            started += 1
        while fleet.running:
            if time.monotonic() - began > plan.timeout:
                raise TimeoutError(f"the chaos crawl took more than {plan.timeout}s")
            for pid, until in list(stopped.items()):
                if time.monotonic() >= until:
                    fleet.signal(pid, signal.SIGCONT)
                    del stopped[pid]
            if pending and web.pages_seen() >= pending[0][0]:
                # The victim is a worker holding leases (one starting up has nothing to lose).
                holding = [pid for pid in sorted(fleet.running) if pid not in stopped]
                holding = [pid for pid in holding if held_by(backend, pid)]
                if holding:
                    _, event = pending.pop(0)
                    pid = rng.choice(holding)
                    if event == "stop":
                        fleet.signal(pid, signal.SIGSTOP)
                        stopped[pid] = time.monotonic() + plan.stop_for
                        stops += 1
                    else:
                        connections.look([pid], now=True)
                        fleet.kill(pid)
                        kills += 1
                        fleet.start()
                        started += 1
                    held += held_by(backend, pid)  # it changes nothing until continued
                    if event == "stop" and writes_stalled(backend):
                        # Stopped holding SQLite's lock or its writer turn, it stalls every
                        # worker: what they hold can lapse meanwhile, and run again.
                        stalls += 1
                        held += sum(held_by(backend, p) for p in fleet.running if p != pid)
            if other_faults and web.pages_seen() >= other_faults[0][0]:
                other_faults.pop(0)[1]()
            connections.look(fleet.running)
            fleet.reap()
            time.sleep(POLL)
    finally:
        for pid in stopped:
            fleet.signal(pid, signal.SIGCONT)
        fleet.close()
    seconds = time.monotonic() - began
    verdict = judge(
        list(web.hits),
        expected,
        concurrency=plan.concurrency,
        interval=plan.delay,
        workers=connections.owners,
    )
    logs = [path.read_text(errors="replace") for path in sorted((workdir / "logs").iterdir())]
    return ChaosResult(
        verdict=verdict,
        kills=kills,
        stops=stops,
        started=started,
        held=held,
        seconds=seconds,
        problems=backend_problems(backend),
        process_failures=fleet.failures(),
        lapsed=sum(log.count("ran out") for log in logs),
        stalls=stalls,
    )


def writes_stalled(url: str) -> bool:
    """Whether a write to the SQLite database at `url` waits longer than STALL_PROBE for its
    lock or for crawlq's writer turn, the flock its writers take first (writelock.py): a stop
    between the two, or just after COMMIT, stalls every worker as well. Never for Redis,
    whose scripts hold no lock between calls."""
    if not url.startswith("sqlite:"):
        return False
    path = path_from_url(url)
    if _turn_stalled(path + SUFFIX):
        return True
    connection = sqlite3.connect(path, timeout=STALL_PROBE, isolation_level=None)
    try:
        connection.execute("BEGIN IMMEDIATE")
        connection.execute("ROLLBACK")
        return False
    except sqlite3.OperationalError:
        return True
    finally:
        connection.close()


def _turn_stalled(lock_path: str) -> bool:
    """Whether the writer turn at `lock_path` stays taken for STALL_PROBE (a write holds it
    for milliseconds)."""
    try:
        descriptor = os.open(lock_path, os.O_RDWR)
    except FileNotFoundError:
        return False
    try:
        deadline = time.monotonic() + STALL_PROBE
        while True:
            try:
                fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    return True
                time.sleep(0.005)
                continue
            fcntl.flock(descriptor, fcntl.LOCK_UN)
            return False
    finally:
        os.close(descriptor)


def held_by(url: str, pid: int) -> int:
    """How many elements the worker process `pid` holds leases on."""

    async def read(backend: Backend) -> int:
        held = 0
        for worker in await backend.workers():
            if worker.pid == pid:
                held += len(await backend.worker_elements(worker.id, limit=1_000_000))
        return held

    return with_backend(url, read)


def backend_problems(url: str) -> list[str]:
    """What is wrong with a queue that should be finished and quiet: the consistency check,
    then anything still queued, running, dead or holding a group slot."""

    async def read(backend: Backend) -> list[str]:
        problems = await backend.check()
        for stats in await backend.queue_stats():
            if stats.total or stats.running or stats.dead:
                problems.append(
                    f"queue {stats.name}: {stats.total} left, {stats.running} running,"
                    f" {stats.dead} dead"
                )
        for group in await backend.group_stats(limit=1_000_000, include_idle=True):
            if group.running or group.queued:
                problems.append(
                    f"group {group.name}: {group.running} in flight, {group.queued} queued"
                )
        return problems

    try:
        return with_backend(url, read)
    except CrawlqError as exc:
        return [f"cannot read the backend: {exc}"]


# -- the case leases cannot cover ---------------------------------------------------------


def frozen_mid_request(
    backend: str, workdir: Path, *, lease: float = 2.0, answer_after: float = 5.0
) -> Verdict:
    """One site, one request at a time, two crawl processes. Its /page/1 takes
    `answer_after` seconds (more than `lease`) to answer; the worker holding it is
    SIGSTOPped as soon as the request arrives and continued once the answer is out. Its
    lease runs out while its request is still open at the server, and the other worker,
    given the page again, sends while it is: the overlap no lease can prevent (the queue
    cannot know a frozen worker's request is still open)."""

    async def slow(request: Request) -> StreamResponse:
        await asyncio.sleep(answer_after)
        return Response(text=page_html("slow", ["/page/2", "/page/3"]), content_type="text/html")

    sites = [Site(name="slow.test", pages=10, routes={"/page/1": slow})]
    with SyntheticWebThread(sites) as web:
        command = crawl_command(
            web, backend=backend, out=workdir / "out", concurrency=1, delay=0.0, lease=lease
        )
        fleet = Fleet(command=command, logs=workdir / "logs", env={**os.environ})
        connections = Connections(web)
        try:
            for _ in range(2):
                fleet.start()
            deadline = time.monotonic() + 120
            pid = None
            while pid is None:
                if time.monotonic() > deadline or not fleet.running:
                    raise RuntimeError("no worker took /page/1")
                if any(hit.path == "/page/1" for hit in list(web.hits)):
                    pid = holder_of(backend, "/page/1")
                connections.look(fleet.running)
                time.sleep(POLL)
            connections.look(fleet.running, now=True)
            fleet.signal(pid, signal.SIGSTOP)
            time.sleep(answer_after + 0.5)  # a span of time by definition: past the answer
            fleet.signal(pid, signal.SIGCONT)
            while fleet.running:
                if time.monotonic() > deadline:
                    raise TimeoutError("the crawl did not finish")
                connections.look(fleet.running)
                fleet.reap()
                time.sleep(POLL)
        finally:
            fleet.close()
        hits = list(web.hits)
        return judge(
            hits, web.expected_pages(), concurrency=1, interval=0.0, workers=connections.owners
        )


def holder_of(url: str, path: str) -> int | None:
    """The pid of the worker holding the element whose key ends with `path`."""

    async def read(backend: Backend) -> int | None:
        for worker in await backend.workers():
            for element in await backend.worker_elements(worker.id, limit=1_000_000):
                if element.key.endswith(path):
                    return worker.pid
        return None

    return with_backend(url, read)
