"""The multi-process metrics folder stays as small as the live processes: what a worker process
counted outlives it (folded into one archive per kind), its live gauges leave with it. Real
processes writing through prometheus-client; /metrics read as the dashboard reads it."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from crawlq.observe.metrics import MULTIPROC_ENV, Snapshot, exposition

from ..conftest import backend_url
from .conftest import APP, ROOT, Board, wait_for

#: Above the largest pid Linux can give (PID_MAX_LIMIT), so never a live process.
NO_PID = 5_000_000

#: A worker process: finishes TASKS tasks of queue `q`, sets a livesum gauge to 1, then exits,
#: or with "wait", says "ready" and waits for its stdin to close.
_COUNT = """
import sys
from prometheus_client import Gauge
for _ in range(int(sys.argv[1])):
    metrics.started("q", 0.1)
    metrics.finished("q", "done", 0.25)
Gauge("crawlq_test_up", "1 while alive.", registry=None, multiprocess_mode="livesum").set(1)
if sys.argv[2:] == ["wait"]:
    print("ready", flush=True)
    sys.stdin.read()
"""
_CHILD = "from crawlq.observe.metrics import worker_metrics\nmetrics = worker_metrics()\n" + _COUNT
#: The same, its files named as if by pid NO_PID (a process that is no more).
_GONE = f"""
from prometheus_client import values
values.ValueClass = values.MultiProcessValue(lambda: {NO_PID})
from crawlq.observe.metrics import worker_metrics
metrics = worker_metrics.__wrapped__()
{_COUNT}
"""
TASKS = 3

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


@pytest.fixture
def folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    made = tmp_path / "prom"
    made.mkdir()
    monkeypatch.setenv(MULTIPROC_ENV, str(made))
    return made


def _env(folder: Path) -> dict[str, str]:
    return {**os.environ, MULTIPROC_ENV: str(folder), "PYTHONPATH": str(ROOT / "src")}


def run_worker(folder: Path, script: str = _CHILD) -> None:
    """Runs one worker process to its clean exit."""
    command = [sys.executable, "-c", script, str(TASKS)]
    subprocess.run(command, env=_env(folder), check=True, timeout=60)


def dead_copies(folder: Path, pids: range) -> None:
    """The files run_worker(folder, _GONE) wrote, as if written by each of `pids` too."""
    written = sorted(folder.glob(f"*_{NO_PID}.db"))
    assert written
    for pid in pids:
        for path in written:
            shutil.copyfile(path, folder / path.name.replace(f"_{NO_PID}.", f"_{pid}."))


@pytest.fixture
def started() -> Iterator[list[subprocess.Popen[str]]]:
    children: list[subprocess.Popen[str]] = []
    yield children
    for child in children:
        if child.poll() is None:
            child.kill()
        child.wait(timeout=30)
        for stream in (child.stdin, child.stdout):
            if stream is not None:
                stream.close()


def start_worker(folder: Path, started: list[subprocess.Popen[str]]) -> subprocess.Popen[str]:
    """A worker process that counted TASKS tasks and now waits (close its stdin to end it)."""
    child = subprocess.Popen(
        [sys.executable, "-c", _CHILD, str(TASKS), "wait"],
        env=_env(folder),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    started.append(child)
    assert child.stdout is not None
    assert child.stdout.readline() == "ready\n"
    return child


def scrape() -> Samples:
    text = exposition(Snapshot(at=0.0, queues=[], groups=[], workers=[])).decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


DONE = ("crawlq_tasks_total", (("outcome", "done"), ("queue", "q")))
DONE_SECONDS = ("crawlq_task_seconds_count", (("outcome", "done"), ("queue", "q")))
CLAIMED = ("crawlq_claimed_elements_total", (("queue", "q"),))
UP = ("crawlq_test_up", ())


def pid_files(folder: Path, pid: int) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if f"_{pid}." in p.name)


def test_workers_that_exit_leave_their_counts_and_no_files(folder: Path) -> None:
    for _ in range(6):
        run_worker(folder)
    found = scrape()
    assert found[DONE] == found[DONE_SECONDS] == found[CLAIMED] == 6 * TASKS
    assert UP not in found, "a live gauge of no live process"
    names = sorted(p.name for p in folder.iterdir())
    assert len(names) <= 4, names  # an archive per kind, the lock


def test_crawlq_worker_processes_leave_their_counts_in_the_archive(
    folder: Path, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    url = backend_url("sqlite", tmp_path, request)
    env = {
        **_env(folder),
        "CRAWLQ_BACKEND": url,
        "CRAWLQ_TEST_RECORD": str(tmp_path / "record.jsonl"),
        "CRAWLQ_TEST_HEAL": str(tmp_path / "heal"),
        "CRAWLQ_TEST_RELEASE": str(tmp_path / "release"),
        "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT)]),
    }
    commands = Board(kind="sqlite", url=url, home=tmp_path, token="", env=env)
    for round_ in range(3):
        commands.schedule("pages", f'"http://a.test/ok/{round_}"')
        commands.crawlq("worker", APP, "--burst")
        names = sorted(p.name for p in folder.iterdir())
        assert names == ["counter_archive.db", "fold.lock", "histogram_archive.db"], names
    done = ("crawlq_tasks_total", (("outcome", "done"), ("queue", "pages")))
    assert scrape()[done] == 3


def test_a_killed_worker_is_folded_at_the_next_scrape(
    folder: Path, started: list[subprocess.Popen[str]]
) -> None:
    first = start_worker(folder, started)
    second = start_worker(folder, started)
    found = scrape()
    assert found[DONE] == 2 * TASKS and found[UP] == 2
    assert pid_files(folder, first.pid) and pid_files(folder, second.pid)

    first.send_signal(signal.SIGKILL)
    first.wait(timeout=30)
    found = scrape()
    assert found[DONE] == found[DONE_SECONDS] == 2 * TASKS, "the killed one's counts kept"
    assert found[UP] == 1, "its live gauge went with it"
    assert pid_files(folder, first.pid) == []
    assert pid_files(folder, second.pid), "a live worker's files stay its own"
    assert scrape()[DONE] == 2 * TASKS, "folded once, counted once"


def test_four_hundred_dead_pids_fold_into_one_archive(folder: Path) -> None:
    run_worker(folder, _GONE)
    dead_copies(folder, range(NO_PID + 1, NO_PID + 400))
    assert scrape()[DONE] == 400 * TASKS
    assert len(list(folder.glob("*.db"))) <= 3
    assert scrape()[DONE] == 400 * TASKS


def test_counts_never_go_back_while_workers_come_and_go(
    folder: Path, started: list[subprocess.Popen[str]]
) -> None:
    seen: list[float] = []
    stop = threading.Event()
    failures: list[BaseException] = []

    def scraper() -> None:
        try:
            while not stop.is_set():
                seen.append(scrape().get(DONE, 0.0))
        except BaseException as exc:  # reported below, in the test's thread
            failures.append(exc)

    reading = threading.Thread(target=scraper)
    reading.start()
    try:
        for round_ in range(8):
            waiting = start_worker(folder, started)
            run_worker(folder)
            if round_ % 2:
                waiting.send_signal(signal.SIGKILL)
            else:
                assert waiting.stdin is not None
                waiting.stdin.close()
            waiting.wait(timeout=30)
        wait_for(lambda: len(seen) > 3, "a few scrapes")
    finally:
        stop.set()
        reading.join(timeout=60)
    assert not failures, failures
    assert seen == sorted(seen), "a count went back"
    assert scrape()[DONE] == 16 * TASKS
    assert len(list(folder.glob("*.db"))) <= 3


#: Folds the folder (argv[3]) and dies, as if killed, at the call `os.<argv[1]>` on argv[2].
_DIES_FOLDING = """
import os, sys
from crawlq.observe import metrics
call, target, folder = sys.argv[1:]
real = getattr(os, call)
def dying(*args, **kwargs):
    if os.path.basename(args[-1]) == target:
        os._exit(3)
    return real(*args, **kwargs)
setattr(os, call, dying)
metrics.processes_families(folder)
"""


@pytest.mark.parametrize(
    ("call", "target"),
    [
        ("replace", "fold.journal"),  # archives written, nothing replaced
        ("replace", "histogram_archive.db"),  # the counters' archive replaced, not the rest
        ("unlink", f"counter_{NO_PID + 7}.db"),  # archives replaced, some dead files removed
    ],
)
def test_a_fold_cut_short_is_finished_without_counting_twice(
    folder: Path, call: str, target: str
) -> None:
    run_worker(folder, _GONE)
    dead_copies(folder, range(NO_PID + 1, NO_PID + 5))
    assert scrape()[DONE] == 5 * TASKS
    run_worker(folder, _GONE)
    dead_copies(folder, range(NO_PID + 5, NO_PID + 9))

    dying = [sys.executable, "-c", _DIES_FOLDING, call, target, str(folder)]
    assert subprocess.run(dying, env=_env(folder), timeout=60).returncode == 3
    found = scrape()
    assert found[DONE] == found[DONE_SECONDS] == 10 * TASKS
    names = sorted(p.name for p in folder.iterdir())
    assert names == ["counter_archive.db", "fold.lock", "histogram_archive.db"]
