"""Three machines crawling through one redis-server, one of them cut off mid-crawl (issue 7,
item 6).

    python -m benchmarks.multihost_bench [--sites 50] [--pages 100] [--kill] [--keep DIR]
        [--hosts 3] [--latency 0.3] [--per-domain 2] [--delay 0.1] [--lease 3] [--outage 8]

Each host is a Linux network namespace with an address of its own on a private bridge
(crawlq.testing.netns; needs root), running `crawlq crawl --backend redis://...` against a
redis-server in this namespace, reached at the bridge's address. The synthetic web runs
here too, every site on an address of its own on the bridge, with a robots.txt disallowing
/page/13 and some latency; it logs every request with its arrival and answer times and the
address it came from. Once a share of the pages is done and the victim holds leases, the
victim's link goes down; its leases run out (`lease`) and the other hosts fetch its pages.
Once they have and the outage has lasted `outage` seconds (longer than a request's timeout),
the victim is plugged back in, or killed, and every crawl runs to its end.

Judged from the server's log (crawlq.testing.chaos.judge) and the queue: every page fetched,
duplicates, politeness (a request arriving while `per_domain` others to its site were
unanswered; two arrivals at a site closer than the delay), the victim's leases fetched by
the others, any request from the victim while cut off or, once back, for a page it had lost,
`crawlq check`, and every group slot free at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import secrets
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from unittest import mock
from urllib.parse import urlsplit

import redis

from crawlq.backends import Backend, open_backend
from crawlq.crawl.testing import Hit, Site, SyntheticWeb, sites
from crawlq.testing.chaos import ROBOTS, Verdict, backend_problems, judge
from crawlq.testing.netns import Host, Network
from crawlq.testing.redis_server import RedisServer

PYTHON = sys.executable
QUEUE = "crawl"
DISALLOWED = "/page/13"
ROBOTS_TXT = f"User-agent: *\nDisallow: {DISALLOWED}\n"
EMPTY: dict[str, Any] = {"headers": {}, "cookies": {}}  # of a logged request: not kept


@dataclass(frozen=True, kw_only=True)
class Scenario:
    hosts: int = 3
    sites: int = 50
    pages: int = 100
    latency: float = 0.3  # seconds per answer: longer than the delay, so concurrency binds too
    per_domain: int = 2
    delay: float = 0.1
    lease: float = 3.0
    timeout: float = 5.0  # seconds per request
    cut_after: float = 0.3  # share of the pages done before the cut
    outage: float = 8.0  # seconds the victim stays cut off at least: more than `timeout`
    kill: bool = False  # kill the victim instead of plugging it back in
    guard: float = 600.0  # seconds: a step that takes longer has hung

    @property
    def expected(self) -> set[tuple[str, str]]:
        """Every page a polite crawler fetches."""
        pages = {
            (f"site{s}.test", f"/page/{n}") for s in range(self.sites) for n in range(self.pages)
        }
        return {page for page in pages if page[1] != DISALLOWED}


@dataclass(kw_only=True)
class Outcome:
    scenario: Scenario
    verdict: Verdict | None = None
    robots: int = 0  # requests for the disallowed page
    held: list[str] = field(default_factory=list)  # the URLs the victim held at the cut
    redelivered: int = 0  # of those, fetched by another host after the cut
    during_cut: int = 0  # requests from the victim while cut off (none can arrive)
    stale: int = 0  # requests from the victim, once back, for a page it had lost
    stale_detail: list[str] = field(default_factory=list)  # each, with the page's other hits
    stale_overlaps: int = 0  # concurrency violations a stale request takes part in
    after_restore: int = 0  # requests from the victim once back, in all
    by_host: dict[str, int] = field(default_factory=dict)  # pages answered, by host address
    exit_codes: list[int | None] = field(default_factory=list)
    check: str = ""  # what `crawlq check` said
    check_code: int | None = None
    problems: list[str] = field(default_factory=list)  # the queue at the end (chaos.py)
    lapsed: int = 0  # the victim's tasks dropped when their lease ran out
    wall: float = 0.0
    cut_at: float = 0.0  # seconds from the start
    restored_at: float = 0.0
    cut_time: float = 0.0  # the same two in epoch seconds, as the server stamps requests
    back_time: float = 0.0
    logs: dict[str, str] = field(default_factory=dict)  # each host's output, the tail

    def violations(self, kind: str, *, robots: bool | None = None) -> int:
        return 0 if self.verdict is None else self.verdict.count(kind, robots=robots)


# -- the pieces ---------------------------------------------------------------------------


def serve(spec: dict[str, Any], first: str, info: Path, log: Path) -> None:
    """The synthetic web, its sites on consecutive addresses from `first`, until SIGTERM;
    then writes every request as a JSON line (with the address it came from)."""

    async def main() -> None:
        octets = tuple(int(part) for part in first.split("."))
        web = SyntheticWeb(
            [
                Site(name=f"site{n}.test", pages=spec["pages"], robots=ROBOTS_TXT, latency=latency)
                for n in range(spec["sites"])
            ],
            first_address=octets[3],
        )
        stop = asyncio.Event()
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
        # SyntheticWeb binds 127.0.1.x, which no other namespace reaches: the same last
        # octets on the bridge's /24 instead.
        with mock.patch.object(sites, "FIRST_ADDRESS", octets):
            async with web:
                where = {name: [web.addresses[name], web.ports[name]] for name in web.sites}
                info.with_suffix(".part").write_text(json.dumps(where))
                info.with_suffix(".part").rename(info)
                await stop.wait()
        with log.open("w") as out:
            for h in web.hits:
                row = [h.host, h.path, h.at, h.ended, h.status, h.peer, h.port]
                out.write(json.dumps(row) + "\n")

    latency = spec["latency"]
    # The server's clock is the judge. It stamps a request with the kernel's receive time
    # of its bytes (crawl.testing.sites), which the server's own scheduling cannot delay;
    # real-time priority keeps its answers on time too, where the system allows it.
    with contextlib.suppress(OSError):
        os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(10))
    asyncio.run(main())


class SiteServer:
    """The synthetic web in a process of its own, so the controller cannot delay it."""

    def __init__(self, scenario: Scenario, addresses: list[str], work: Path) -> None:
        self.spec = {"sites": scenario.sites, "pages": scenario.pages, "latency": scenario.latency}
        self.first = addresses[0]
        self.info = work / "sites.json"
        self.log = work / "hits.jsonl"
        self.process: subprocess.Popen[bytes] | None = None
        self.sites: dict[str, tuple[str, int]] = {}

    def __enter__(self) -> SiteServer:
        for stale in (self.info, self.log):  # from an earlier run in the same folder
            stale.unlink(missing_ok=True)
        command = [PYTHON, "-m", "benchmarks.multihost_bench", "serve", json.dumps(self.spec)]
        self.process = subprocess.Popen([*command, self.first, str(self.info), str(self.log)])
        deadline = time.monotonic() + 60
        while not self.info.exists():
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.__exit__()
                raise AssertionError("the synthetic web did not start")
            time.sleep(0.05)
        found = json.loads(self.info.read_text())
        self.sites = {name: (address, int(port)) for name, (address, port) in found.items()}
        return self

    def __exit__(self, *exc: object) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait()

    def seeds(self) -> list[str]:
        return [f"http://{name}:{port}/page/0" for name, (_, port) in self.sites.items()]

    def hits(self) -> list[Hit]:
        """Stops the server; every request it served."""
        assert self.process is not None
        self.process.send_signal(signal.SIGTERM)
        self.process.wait(120)
        with self.log.open() as lines:
            rows = map(json.loads, lines)
            return [
                Hit(host=h, method="GET", path=p, at=a, ended=e, status=s, peer=c, port=n, **EMPTY)
                for h, p, a, e, s, c, n in rows
            ]


@contextlib.contextmanager
def shared_redis(net: Network) -> Iterator[RedisServer]:
    """A redis-server on loopback and on the bridge, with a password (Redis refuses other
    addresses than loopback without one)."""
    server = RedisServer(password=secrets.token_hex(12))
    server.start()
    try:
        with redis.Redis(port=server.port, password=server.password) as client:
            client.config_set("bind", f"127.0.0.1 {net.gateway}")
        yield server
    finally:
        server.remove()


def crawl_command(
    scenario: Scenario, server: SiteServer, net: Network, backend: str, out: Path
) -> list[str]:
    command = [PYTHON, "-m", "crawlq", "crawl", *server.seeds()]
    for name, (address, _) in server.sites.items():
        command += ["--resolve", f"{name}={address}"]
    options = {
        "--allow-network": net.network,
        "--backend": backend,
        "--out": str(out),
        "--concurrency-per-domain": str(scenario.per_domain),
        "--delay": str(scenario.delay),
        "--lease": str(scenario.lease),
        "--timeout": str(scenario.timeout),
        "--max-attempts": "5",
        "--retry-delay": "0.2",
        "--log-level": "WARNING",
    }
    return [*command, "--resolve-only", "--no-progress", *(x for o in options.items() for x in o)]


class Pages:
    """What one host's crawl has written to its pages.jsonl so far, read as it grows."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.records: list[dict[str, Any]] = []
        self._offset = 0

    def read(self) -> list[dict[str, Any]]:
        if self.path.exists():
            with self.path.open("rb") as lines:
                lines.seek(self._offset)
                data = lines.read()
            complete = data[: data.rfind(b"\n") + 1]
            self._offset += len(complete)
            self.records += [json.loads(line) for line in complete.splitlines()]
        return self.records

    def fetched(self) -> set[str]:
        return {r["url"] for r in self.read() if r["status"] == 200}


class Crawl:
    """`crawlq crawl` on one host."""

    def __init__(self, host: Host, work: Path) -> None:
        self.host = host
        self.out = work / host.name
        self.pages = Pages(self.out / "pages.jsonl")
        self.log = work / f"{host.name}.log"
        self.process: subprocess.Popen[bytes] | None = None
        self.started = time.monotonic()

    def start(self, command: list[str]) -> None:
        with self.log.open("wb") as log:
            self.process = self.host.popen(
                command, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT
            )
        self.started = time.monotonic()

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    def code(self) -> int | None:
        return None if self.process is None else self.process.poll()

    async def ended(self) -> bool:
        return self.code() is not None

    def output(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""


async def until(
    condition: Callable[[], Awaitable[bool]], what: str, timeout: float, crawls: Sequence[Crawl]
) -> None:
    """Polls `condition` until true; AssertionError after `timeout` seconds, or at once if
    one of `crawls` has exited with an error."""
    deadline = time.monotonic() + timeout
    while not await condition():
        for crawl in crawls:
            if crawl.code() not in (None, 0):
                raise AssertionError(
                    f"{crawl.host.name}'s crawl exited with {crawl.code()} while waiting for"
                    f" {what}:\n{crawl.output()[-3000:]}"
                )
        if time.monotonic() > deadline:
            tails = "".join(
                f"\n--- {c.host.name} (exit {c.code()}):\n{c.output()[-1500:]}" for c in crawls
            )
            raise AssertionError(f"timed out after {timeout:g}s waiting for {what}{tails}")
        await asyncio.sleep(0.05)


def page_of(url: str) -> tuple[str, str]:
    parts = urlsplit(url)
    return (parts.hostname or "", parts.path)


# -- the run ------------------------------------------------------------------------------


async def run(scenario: Scenario, work: Path) -> Outcome:
    """The whole scenario, in `work`; AssertionError if it cannot be carried out (a crawl
    fails, a step times out). The outcome says what happened; judging it is the caller's."""
    outcome = Outcome(scenario=scenario)
    with Network(hosts=scenario.hosts) as net, shared_redis(net) as redis_server:
        namespace = f"multihost-{net.tag}"
        local = f"{redis_server.url}?namespace={namespace}"
        password, port = redis_server.password, redis_server.port
        remote = f"redis://:{password}@{net.gateway}:{port}/0?namespace={namespace}"
        with SiteServer(scenario, net.add_addresses(scenario.sites), work) as server:
            crawls = [Crawl(host, work) for host in net.hosts]
            backend = open_backend(local)
            await backend.open()
            try:
                for crawl in crawls:
                    crawl.start(crawl_command(scenario, server, net, remote, crawl.out))
                await _cut_off(scenario, net, crawls, backend, outcome)
                living = crawls[1:] if scenario.kill else crawls
                for crawl in living:
                    what = f"{crawl.host.name}'s crawl to end"
                    await until(crawl.ended, what, scenario.guard, living)
            finally:
                await backend.close()
                outcome.exit_codes = [crawl.code() for crawl in crawls]
                outcome.logs = {crawl.host.name: crawl.output()[-3000:] for crawl in crawls}
            outcome.wall = time.monotonic() - crawls[0].started
            outcome.lapsed = crawls[0].output().count("ran out")
            await _final_state(local, outcome)
            hits = server.hits()
    _judge(outcome, hits, net.hosts[0].address)
    return outcome


async def _cut_off(
    scenario: Scenario, net: Network, crawls: list[Crawl], backend: Backend, outcome: Outcome
) -> None:
    """Cuts the first host off once it is mid-crawl; waits until its leased pages were
    fetched by the others and the outage lasted `outage`; then plugs it back in (or kills
    it)."""
    victim, others = crawls[0], crawls[1:]
    worker = ""

    async def registered() -> bool:
        nonlocal worker
        worker = next((w.id for w in await backend.workers() if w.pid == victim.pid), "")
        return bool(worker)

    await until(registered, "the victim's worker to register", 60, crawls)
    wanted = scenario.cut_after * len(scenario.expected)

    async def busy() -> bool:
        done = sum(len(c.pages.read()) for c in crawls)
        return done >= wanted and bool(await backend.worker_elements(worker))

    # The victim holds leases whenever it is mid-crawl; should it ack them all in the moment
    # between the look and the cut, it is plugged back in and the cut tried again.
    for _ in range(10):
        await until(busy, f"{wanted:.0f} pages done and the victim holding leases", 120, crawls)
        net.cut(victim.host)
        cut, outcome.cut_time = time.monotonic(), time.time()
        held = await backend.worker_elements(worker, limit=1_000_000)
        if held:
            break
        net.restore(victim.host)
    else:
        raise AssertionError("the victim never held a lease at the cut")
    outcome.cut_at = cut - victim.started
    outcome.held = sorted(e.key for e in held)

    async def taken_over() -> bool:
        again: set[str] = set().union(*(c.pages.fetched() for c in others))
        return again >= set(outcome.held) and time.monotonic() - cut >= scenario.outage

    what = "the victim's pages to be fetched by the others"
    await until(taken_over, what, scenario.outage + scenario.guard, others)
    if scenario.kill:
        assert victim.process is not None
        victim.process.kill()
        victim.process.wait()
    net.restore(victim.host)  # once killed, nothing runs there any more
    outcome.back_time = time.time()
    outcome.restored_at = time.monotonic() - victim.started


async def _final_state(url: str, outcome: Outcome) -> None:
    """`crawlq check`, then what chaos.py finds wrong with a queue that should be done."""
    check = await asyncio.create_subprocess_exec(
        *(PYTHON, "-m", "crawlq", "check", "--backend", url),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    said, _ = await asyncio.wait_for(check.communicate(), 120)
    outcome.check, outcome.check_code = said.decode(errors="replace").strip(), check.returncode
    outcome.problems = await asyncio.to_thread(backend_problems, url)


def _judge(outcome: Outcome, hits: list[Hit], victim: str) -> None:
    scenario = outcome.scenario
    outcome.verdict = judge(
        hits, scenario.expected, concurrency=scenario.per_domain, interval=scenario.delay
    )
    outcome.robots = sum(1 for h in hits if h.path == DISALLOWED)
    pages = [h for h in hits if h.status == 200 and h.path != ROBOTS]
    outcome.by_host = dict(Counter(h.peer for h in pages))
    cut, back = outcome.cut_time, outcome.back_time
    lost = {page_of(url) for url in outcome.held}
    again = {(h.host, h.path) for h in pages if h.at > cut and h.peer != victim}
    outcome.redelivered = len(lost & again)
    mine = [h for h in hits if h.peer == victim]
    outcome.during_cut = sum(1 for h in mine if cut < h.at < back)
    outcome.after_restore = sum(1 for h in mine if h.at >= back)
    stale = [h for h in mine if h.at >= back and (h.host, h.path) in lost]
    outcome.stale = len(stale)
    for h in stale:  # a page the victim got again (put back, say) shows its other requests
        others = [o for o in hits if (o.host, o.path) == (h.host, h.path) and o is not h]
        seen = ", ".join(f"{o.peer} {o.at - cut:+.3f}s {o.status}" for o in others)
        outcome.stale_detail.append(f"{h.host}{h.path} {h.at - cut:+.3f}s after the cut; {seen}")
    outcome.stale_overlaps = sum(
        1
        for v in outcome.verdict.violations
        if v.kind == "concurrency"
        and any(h.host == v.host and h.at <= v.at < (h.ended or h.at) for h in stale)
    )


# -- the report ---------------------------------------------------------------------------


def table(outcomes: Sequence[Outcome]) -> str:
    rows = [
        "| hosts | victim | pages | duplicates | concurrency violations | interval violations"
        " (robots.txt) | min gap ms | leases held at the cut | re-delivered"
        " | victim's requests once back (stale) | check | wall s |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for o in outcomes:
        v = o.verdict
        assert v is not None
        ok = o.check_code == 0 and not o.problems
        gap = "-" if v.min_gap is None else f"{v.min_gap * 1000:.1f}"
        back = f"{o.after_restore} ({o.stale})"
        rows.append(
            f"| {o.scenario.hosts} | {'killed' if o.scenario.kill else 'restored'}"
            f" | {v.pages}/{v.expected} | {v.duplicates} | {o.violations('concurrency')}"
            f" | {o.violations('interval')} ({o.violations('interval', robots=True)}) | {gap}"
            f" | {len(o.held)} | {o.redelivered}/{len(o.held)} | {back}"
            f" | {'consistent' if ok else '**FAILED**'} | {o.wall:.1f} |"
        )
    return "\n".join(rows)


def summary(outcome: Outcome) -> dict[str, Any]:
    v = outcome.verdict
    assert v is not None
    return {
        "pages": v.pages,
        "expected": v.expected,
        "missing": v.missing[:10],
        "requests": v.requests,
        "duplicates": v.duplicates,
        # Each with the requests involved (arrival, answer, the host they came from).
        "concurrency_detail": v.explain("concurrency"),
        "interval_shortest": v.explain("interval", 10),
        "robots": outcome.robots,
        "held": len(outcome.held),
        "redelivered": outcome.redelivered,
        "during_cut": outcome.during_cut,
        "after_restore": outcome.after_restore,
        "stale": outcome.stale,
        "stale_overlaps": outcome.stale_overlaps,
        "stale_detail": outcome.stale_detail,
        "lapsed": outcome.lapsed,
        "by_host": outcome.by_host,
        "exit_codes": outcome.exit_codes,
        "check": outcome.check_code,
        "problems": outcome.problems,
        "cut_at": round(outcome.cut_at, 2),
        "restored_at": round(outcome.restored_at, 2),
        "wall": round(outcome.wall, 2),
    }


TUNABLE = ("hosts", "sites", "pages", "latency", "per_domain", "delay", "lease", "outage")


def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else argv
    if args[:1] == ["serve"]:
        serve(json.loads(args[1]), args[2], Path(args[3]), Path(args[4]))
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    defaults = Scenario()
    for name in TUNABLE:
        value = getattr(defaults, name)
        option = "--" + name.replace("_", "-")
        parser.add_argument(option, dest=name, type=type(value), default=value)
    parser.add_argument("--kill", action="store_true", help="kill the victim, do not restore it")
    parser.add_argument("--keep", type=Path, help="keep the crawls' output in this new folder")
    options = parser.parse_args(args)
    tuned = {name: getattr(options, name) for name in TUNABLE}
    scenario = Scenario(**tuned, kill=options.kill)
    with tempfile.TemporaryDirectory(prefix="multihost-") as temporary:
        work = options.keep or Path(temporary)
        work.mkdir(parents=True, exist_ok=True)
        outcome = asyncio.run(run(scenario, work))
    print(json.dumps(summary(outcome), indent=1), flush=True)
    print(table([outcome]))


if __name__ == "__main__":
    main()
