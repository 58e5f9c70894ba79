"""Real worker processes on a real SQLite file and a real redis-server: politeness across
processes, crash safety, graceful stop, wake-ups, and a Redis restart in mid-run. Waits are
bounded polls for a condition, never fixed sleeps."""

from __future__ import annotations

import asyncio
import functools
import importlib
import itertools
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

import crawlq
from crawlq import writelock
from crawlq.backends import open_backend
from crawlq.testing.redis_server import RedisServer
from crawlq.types import JSON, GroupStats, QueueStats
from crawlq.worker import supervisor

from .apps.record import peak_overlap, read_events
from .conftest import BACKENDS, backend_url
from .helpers import can_take

ROOT = Path(__file__).resolve().parent.parent
APP = "tests.apps.proc_app:app"


@dataclass
class Env:
    url: str
    record: Path
    vars: dict[str, str]

    def events(self) -> list[dict[str, Any]]:
        return read_events(self.record)

    def worker(self, *args: str) -> subprocess.Popen[bytes]:
        return subprocess.Popen(
            [sys.executable, "-m", "crawlq", "worker", APP, *args],
            cwd=ROOT,
            env=self.vars,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )

    def app(self) -> crawlq.App:
        saved = {k: os.environ.get(k) for k in self.vars}
        os.environ.update(self.vars)
        try:
            sys.modules.pop("tests.apps.proc_app", None)
            module = importlib.import_module("tests.apps.proc_app")
            app: crawlq.App = module.app
            return app
        finally:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v


def make_env(url: str, tmp_path: Path) -> Env:
    record = tmp_path / "record.jsonl"
    variables = {
        **os.environ,
        "CRAWLQ_BACKEND": url,
        "CRAWLQ_RECORD": str(record),
        "PYTHONPATH": str(ROOT),
    }
    return Env(url=url, record=record, vars=variables)


@pytest.fixture(params=BACKENDS)
def env(request: pytest.FixtureRequest, tmp_path: Path) -> Env:
    return make_env(backend_url(request.param, tmp_path, request), tmp_path)


def wait_for(condition: Callable[[], bool], timeout: float = 60, what: str = "") -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.02)


def finish(proc: subprocess.Popen[bytes], timeout: float = 120) -> str:
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, _ = proc.communicate()
        raise AssertionError(f"worker did not exit:\n{out.decode()}") from None
    return out.decode()


def queue_stats(app: crawlq.App, queue: str) -> QueueStats:
    (stats,) = app.stats([queue])
    return stats


def polite_groups(url: str) -> list[GroupStats]:
    async def read() -> list[GroupStats]:
        backend = open_backend(url, create=False)
        await backend.open()
        try:
            return await backend.group_stats("polite.test", include_idle=True)
        finally:
            await backend.close()

    return asyncio.run(read())


def live_workers(url: str) -> int:
    async def read() -> int:
        backend = open_backend(url, create=False)
        await backend.open()
        try:
            return len(await backend.workers())
        finally:
            await backend.close()

    return asyncio.run(read())


def run_competing(env: Env, workers: list[subprocess.Popen[bytes]], elements: list[str]) -> None:
    """Waits until every worker process is registered and idle, schedules `elements`, waits for
    them all to end, then stops the workers. Each worker runs one task at a time (-c 1), so
    two elements in flight at once means two processes ran at once."""
    app = env.app()
    with app:
        app.schedule_many("hit", ["http://polite.test/warm-up"])  # registers the queues
    wait_for(lambda: live_workers(env.url) == 4, what="four registered workers")
    with app:
        app.schedule_many("hit", list(elements))
    wanted = {*elements, "http://polite.test/warm-up"}
    wait_for(
        lambda: {e["element"] for e in env.events() if e["event"] == "end"} >= wanted,
        timeout=120,
        what="every element to end",
    )
    for worker in workers:
        worker.send_signal(signal.SIGTERM)
    for worker in workers:
        output = finish(worker)
        assert worker.returncode == 0, output


@pytest.mark.timeout(300)  # its own limits (120 s) must fail first, with a diagnosis
def test_four_processes_never_exceed_a_groups_concurrency(env: Env) -> None:
    env.vars.update(TEST_CONCURRENCY="2", TEST_HIT_SECONDS="0.05", TEST_CROWD="2")
    elements = [f"http://polite.test/{i}" for i in range(120)]
    run_competing(env, [env.worker("--processes", "4", "-c", "1")], elements)
    events = env.events()
    starts = [e for e in events if e["event"] == "start"]
    assert sorted(e["element"] for e in starts if e["element"] in elements) == sorted(elements)
    assert not [e for e in events if e["event"] == "crowd-timeout"]
    assert peak_overlap(events) == 2  # one slot a process: two processes at once, never three
    assert len({e["pid"] for e in starts}) >= 2


def test_four_processes_keep_a_groups_interval(env: Env) -> None:
    env.vars.update(TEST_INTERVAL="0.1", TEST_HIT_SECONDS="0.01")
    app = env.app()
    with app:
        app.schedule_many("hit", [f"http://polite.test/{i}" for i in range(30)])
    proc = env.worker("--processes", "4", "--burst")
    output = finish(proc)
    assert proc.returncode == 0, output
    claims = sorted(e["claimed_at"] for e in env.events() if e["event"] == "start")
    assert len(claims) == 30
    gaps = [b - a for a, b in itertools.pairwise(claims)]
    assert min(gaps) >= 0.1 - 1e-6, gaps  # doubles of epoch seconds: see below


def test_sigkill_mid_task_loses_nothing(env: Env) -> None:
    env.vars.update(TEST_LEASE="2")
    app = env.app()
    elements: list[JSON] = [{"n": i, "on": [1] if i == 0 else []} for i in range(4)]
    with app:
        app.schedule_many("hold", elements)
    victim = env.worker()
    with app:
        wait_for(lambda: queue_stats(app, "hold").total == 1, what="three quick elements acked")
    victim.send_signal(signal.SIGKILL)
    finish(victim)
    with app:
        stats = queue_stats(app, "hold")
        assert (stats.total, stats.running) == (1, 1)
    rescuer = env.worker("--burst")
    output = finish(rescuer)
    assert rescuer.returncode == 0, output
    ends = [e for e in env.events() if e["event"] == "end"]
    assert sorted(e["element"]["n"] for e in ends) == [0, 1, 2, 3]
    assert [e["attempt"] for e in ends if e["element"] == elements[0]] == [2]
    with app:
        stats = queue_stats(app, "hold")
        assert (stats.total, stats.running, stats.dead) == (0, 0, 0)


def test_sigkill_of_a_polite_group_slot_is_freed_after_the_lease(env: Env) -> None:
    env.vars.update(TEST_LEASE="1.5", TEST_CONCURRENCY="1", TEST_HIT_SECONDS="600")
    app = env.app()
    with app:
        app.schedule_many("hit", ["http://polite.test/a", "http://polite.test/b"])
    victim = env.worker()
    wait_for(lambda: any(e["event"] == "start" for e in env.events()), what="the first start")
    victim.send_signal(signal.SIGKILL)
    finish(victim)

    (group,) = polite_groups(env.url)
    assert group.running == 1
    env.vars.update(TEST_HIT_SECONDS="0")
    rescuer = env.worker("--burst")
    output = finish(rescuer)
    assert rescuer.returncode == 0, output
    (group,) = polite_groups(env.url)
    assert (group.running, group.queued) == (0, 0)


def test_sigterm_returns_unfinished_work_at_once(env: Env) -> None:
    app = env.app()
    with app:
        app.schedule_many("hold", [{"n": i} for i in range(3)])
    worker = env.worker("--grace", "0.3")
    wait_for(lambda: len(env.events()) == 3, what="three starts")
    started = time.monotonic()
    worker.send_signal(signal.SIGTERM)
    output = finish(worker)
    assert worker.returncode == 0, output
    assert time.monotonic() - started < 30, "returned only after the lease, not at once"
    with app:
        stats = queue_stats(app, "hold")
        assert (stats.total, stats.due, stats.running) == (3, 3, 0)


def test_sigterm_lets_running_tasks_finish_within_the_grace_period(env: Env) -> None:
    app = env.app()
    with app:
        app.schedule("hold", {"seconds": 0.5})
    worker = env.worker("--grace", "30")
    wait_for(lambda: len(env.events()) == 1, what="the start")
    worker.send_signal(signal.SIGTERM)
    output = finish(worker)
    assert worker.returncode == 0, output
    assert [e["event"] for e in env.events()] == ["start", "end"]
    with app:
        assert queue_stats(app, "hold").total == 0


def test_released_elements_keep_their_attempt_count(env: Env) -> None:
    app = env.app()
    with app:
        app.schedule("hold", {"on": [1, 2]})
    worker = env.worker("--grace", "0")
    wait_for(lambda: len(env.events()) == 1, what="the start")
    worker.send_signal(signal.SIGTERM)
    finish(worker)
    worker = env.worker("--grace", "0")
    wait_for(lambda: len(env.events()) == 2, what="the second start")
    worker.send_signal(signal.SIGTERM)
    finish(worker)
    assert [e["attempt"] for e in env.events()] == [1, 1]


def test_an_idle_worker_wakes_when_work_is_scheduled(env: Env) -> None:
    app = env.app()
    with app:
        app.schedule("hold", {"on": []})  # registers the queues
        worker = env.worker()
        try:
            wait_for(lambda: len(env.events()) == 2, what="the first element")
            wait_for(lambda: queue_stats(app, "hold").total == 0, what="the ack")
            scheduled = time.monotonic()
            app.schedule("hold", {"on": [], "n": 2})
            wait_for(lambda: len(env.events()) == 4, timeout=20, what="the wake-up")
            # An idle worker sleeps up to 30 s when nobody wakes it.
            assert time.monotonic() - scheduled < 20
        finally:
            worker.send_signal(signal.SIGTERM)
            finish(worker)


@pytest.mark.timeout(300)  # its own limits (120 s) must fail first, with a diagnosis
def test_separate_workers_share_a_groups_limits(env: Env) -> None:
    """Four `crawlq worker` commands, as on four machines: one group's concurrency and
    interval hold across all of them."""
    env.vars.update(
        TEST_CONCURRENCY="2", TEST_INTERVAL="0.02", TEST_HIT_SECONDS="0.1", TEST_CROWD="2"
    )
    elements = [f"http://polite.test/{i}" for i in range(60)]
    run_competing(env, [env.worker("-c", "1") for _ in range(4)], elements)
    events = env.events()
    starts = [e for e in events if e["event"] == "start"]
    assert sorted(e["element"] for e in starts if e["element"] in elements) == sorted(elements)
    assert not [e for e in events if e["event"] == "crowd-timeout"]
    assert peak_overlap(events) == 2
    claims = sorted(e["claimed_at"] for e in starts)
    # Epoch seconds as doubles are exact to ~2.4e-7 s (Redis's clock to 1e-6 s): a gap the
    # queue kept at 0.02 can read 0.019999981 from the two claim times.
    assert min(b - a for a, b in itertools.pairwise(claims)) >= 0.02 - 1e-6
    assert len({e["pid"] for e in starts}) >= 2


@pytest.mark.parametrize("kill", [False, True], ids=["sigterm", "sigkill"])
def test_a_redis_restart_mid_run_loses_no_element(tmp_path: Path, kill: bool) -> None:
    """With appendonly and appendfsync always, Redis restarting (cleanly or killed) under a
    working worker and a scheduler loses nothing: every element runs, the queue ends empty."""
    server = RedisServer(appendonly=True, appendfsync="always")
    server.start()
    try:
        env = make_env(f"{server.url}?namespace=restart", tmp_path)
        env.vars.update(TEST_LEASE="5", TEST_HIT_SECONDS="0.01")
        app = env.app()
        first: list[JSON] = [{"on": [], "n": i} for i in range(300)]
        later: list[JSON] = [{"on": [], "n": i} for i in range(300, 400)]
        with app:
            app.schedule_many("hold", first)
        worker = env.worker("-c", "10")
        try:
            wait_for(lambda: len(env.events()) >= 200, what="a third of the run")
            server.restart(kill=kill)
            with app:
                app.schedule_many("hold", later)
            wait_for(
                lambda: (
                    {e["element"]["n"] for e in env.events() if e["event"] == "end"}
                    >= set(range(400))
                ),
                timeout=90,
                what="every element to run",
            )
            with app:
                wait_for(lambda: queue_stats(app, "hold").total == 0, what="the last acks")
                stats = queue_stats(app, "hold")
                assert (stats.running, stats.dead) == (0, 0)
        finally:
            worker.send_signal(signal.SIGTERM)
            output = finish(worker)
        assert worker.returncode == 0, output
    finally:
        server.remove()


def test_one_ctrl_c_at_the_terminal_lets_each_process_finish_its_tasks(tmp_path: Path) -> None:
    """A Ctrl-C at a terminal signals its whole foreground process group: each child of
    `--processes` must get one stop (running tasks get the grace period), not two (hurry)."""
    env = make_env(f"sqlite:///{tmp_path / 'queue.db'}", tmp_path)
    app = env.app()
    with app:
        app.schedule_many("hold", [{"n": n, "seconds": 3} for n in range(2)])
    parent = two_workers(env, "--grace", "60", "--log-level", "info", output=subprocess.PIPE)
    wait_for(lambda: len({e["pid"] for e in env.events()}) == 2, what="a task in each process")
    os.killpg(parent.pid, signal.SIGINT)  # as a terminal does
    output = finish(parent)
    assert parent.returncode == 0, output
    assert "hurrying" not in output, output
    assert sorted(e["element"]["n"] for e in env.events() if e["event"] == "end") == [0, 1]
    with app:
        assert queue_stats(app, "hold").total == 0


def test_a_stop_during_the_restart_pause_starts_no_process_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A child is killed; while the parent waits to start it again, it is told to stop: it
    stops the other child and starts none."""
    env = make_env(f"sqlite:///{tmp_path / 'queue.db'}", tmp_path)
    app = env.app()
    with app:
        app.schedule_many("hold", [{"n": n} for n in range(2)])  # each held for an hour
    for name in ("CRAWLQ_BACKEND", "CRAWLQ_RECORD", "PYTHONPATH"):
        monkeypatch.setenv(name, env.vars[name])
    monkeypatch.chdir(ROOT)
    monkeypatch.setattr(supervisor, "RESTART_PAUSE", 600.0)
    pausing = threading.Event()

    class Restarts(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if "starting it again" in record.getMessage():
                pausing.set()

    def kill_one_then_stop() -> None:
        wait_for(lambda: len({e["pid"] for e in env.events()}) == 2, what="two processes")
        os.kill(env.events()[0]["pid"], signal.SIGKILL)
        if pausing.wait(120):
            os.kill(os.getpid(), signal.SIGTERM)  # reaches the parent: this process

    handler = Restarts()
    logging.getLogger("crawlq.supervisor").addHandler(handler)
    helper = threading.Thread(target=kill_one_then_stop)
    helper.start()
    try:
        started = time.monotonic()
        code = supervisor.supervise([APP, "-c", "1", "--grace", "0"], 2, restart=True)
        stopped_after = time.monotonic() - started
    finally:
        helper.join()
        logging.getLogger("crawlq.supervisor").removeHandler(handler)
    assert code == -signal.SIGKILL
    assert stopped_after < 120, "it waited out the pause"
    assert [e["event"] for e in env.events()] == ["start", "start"]  # nothing started again
    with app:
        stats = queue_stats(app, "hold")
        assert (stats.total, stats.running) == (2, 1)  # the killed one's lease runs on


def test_ctrl_z_stops_every_process_between_writes_and_fg_continues_them(
    tmp_path: Path,
) -> None:
    """A Ctrl-Z at the terminal reaches the parent alone: it stops its children too, each
    once out of its SQLite write turn, so no other writer waits on a stopped one; the
    shell's SIGCONT continues them all, and nothing is lost."""
    env = make_env(f"sqlite:///{tmp_path / 'queue.db'}", tmp_path)
    app = env.app()
    with app:
        app.schedule_many("hold", [{"n": n, "seconds": 0.002} for n in range(3000)])
    parent = two_workers(env, output=subprocess.PIPE)
    wait_for(lambda: len({e["pid"] for e in env.events()}) == 2, what="a task in each process")
    children = {e["pid"] for e in env.events()}
    for _ in range(3):
        os.kill(parent.pid, signal.SIGTSTP)  # as a terminal does: the parent's group
        for pid in (parent.pid, *children):
            wait_for(functools.partial(stopped, pid), what=f"process {pid} stopped")
        assert can_take(f"{tmp_path / 'queue.db'}{writelock.SUFFIX}")
        done = len(env.events())
        os.kill(parent.pid, signal.SIGCONT)
        wait_for(functools.partial(more_events, env, done), what="work after SIGCONT")
    with app:
        wait_for(lambda: queue_stats(app, "hold").total == 0, what="the queue drained")
    os.kill(parent.pid, signal.SIGINT)
    output = finish(parent)
    assert parent.returncode == 0, output
    ended = sorted(e["element"]["n"] for e in env.events() if e["event"] == "end")
    assert ended[0] == 0 and ended[-1] == 2999 and len(set(ended)) == 3000


def stopped(pid: int) -> bool:
    with open(f"/proc/{pid}/stat") as stat:
        return stat.read().rsplit(")", 1)[1].split()[0] == "T"


def more_events(env: Env, than: int) -> bool:
    return len(env.events()) > than


def test_the_children_of_a_parent_killed_outright_stop_too(tmp_path: Path) -> None:
    """Children run out of the terminal's reach (sessions of their own): a parent killed with
    SIGKILL, which forwards nothing, must not leave them running."""
    env = make_env(f"sqlite:///{tmp_path / 'queue.db'}", tmp_path)
    app = env.app()
    with app:
        app.schedule_many("hold", [{"n": n} for n in range(2)])  # each held for an hour
    parent = two_workers(env, "--grace", "0")
    wait_for(lambda: len({e["pid"] for e in env.events()}) == 2, what="a task in each process")
    children = {e["pid"] for e in env.events()}
    parent.kill()
    parent.wait()
    wait_for(lambda: not any(map(alive, children)), what="the children to stop")
    with app:
        assert queue_stats(app, "hold").running == 0  # each gave its element back


def alive(pid: int) -> bool:
    """Running, not a zombie waiting for a parent that is gone."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return False
    return "\nState:\tZ" not in status


def two_workers(
    env: Env, *options: str, output: int = subprocess.DEVNULL
) -> subprocess.Popen[bytes]:
    """`crawlq worker APP -p 2 -c 1 OPTIONS` in a session of its own, as a terminal starts
    a command (its Ctrl-C then signals the whole group)."""
    command = [sys.executable, "-m", "crawlq", "worker", APP, "-p", "2", "-c", "1", *options]
    return subprocess.Popen(
        command,
        cwd=ROOT,
        env=env.vars,
        stdout=output,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
