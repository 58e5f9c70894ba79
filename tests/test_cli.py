"""Acceptance tests of the `crawlq` command: the real CLI in a subprocess, on a real SQLite file.

Every test gets its own tmp_path: the database, the file the job's tasks record their runs in
(see tests/apps/cli_app.py), and an empty working folder the commands run in, so that a
command that wrongly falls back to the default `sqlite:///crawlq.db` shows up there instead
of in the repository. Nothing touches the network. Results are read back through the CLI
itself (`crawlq stats --json`, `dead list --json`, `limits list --json`).

No assertion depends on timing: subprocesses get a generous timeout, and a command that
outlives it fails its test with what it printed.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import sqlite3
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Sequence
from contextlib import closing
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click
import pytest

from crawlq.cli.common import connected
from crawlq.cli.main import cli as command_line

REPO = Path(__file__).resolve().parent.parent
APP = "tests.apps.cli_app:app"
TIMEOUT = 60.0

#: What tests/apps/cli_app.py schedules (CRAWLQ_TEST_PAGES is set to PAGES for every run).
PAGES = 12
HOSTS = ("a.example.test", "b.example.test", "c.example.test")
QUEUES = ["explode", "fetch", "normalize", "seed"]

SUMMARY = re.compile(r"^done (\d+), failed (\d+) \(dead (\d+)\), returned (\d+)$", re.MULTILINE)
REPORT = re.compile(
    r"^added (\d+), moved (\d+), kept (\d+), deferred (\d+) \(running\), skipped (\d+) \(seen\)$"
)


def page_url(n: int) -> str:
    return f"http://{HOSTS[n % len(HOSTS)]}/page/{n}"


def everything_once() -> Counter[str]:
    """The runs `crawlq start` + a burst worker must make: each element exactly once."""
    expected: Counter[str] = Counter(["seed None"])
    for n in range(PAGES):
        expected[f"fetch {page_url(n)}"] += 1
        expected[f"normalize {page_url(n)}"] += 1
    expected['explode {"boom":1} attempt 1'] += 1
    expected['explode {"boom":1} attempt 2'] += 1
    return expected


@dataclass(frozen=True)
class Ran:
    args: tuple[str, ...]
    pid: int
    code: int
    out: str
    err: str

    def __str__(self) -> str:
        return (
            f"`crawlq {' '.join(self.args)}` exited {self.code}\n"
            f"--- stdout:\n{self.out}--- stderr:\n{self.err}"
        )


def report(ran: Ran) -> dict[str, int]:
    """The counts `schedule` and `start` print."""
    match = REPORT.fullmatch(ran.out.strip())
    assert match, ran
    names = ["added", "moved", "kept", "deferred", "skipped"]
    return dict(zip(names, map(int, match.groups()), strict=True))


def counts(**given: int) -> dict[str, int]:
    return {"added": 0, "moved": 0, "kept": 0, "deferred": 0, "skipped": 0, **given}


def summaries(ran: Ran) -> list[tuple[int, int, int, int]]:
    """The `done D, failed F (dead X), returned R` lines burst workers print, one per process."""
    return [(int(d), int(f), int(x), int(r)) for d, f, x, r in SUMMARY.findall(ran.err)]


class Cli:
    """Runs `python -m crawlq ...` against this test's own database and record file."""

    def __init__(self, home: Path) -> None:
        self.home = home
        self.db = home / "queue.db"
        self.url = f"sqlite:///{self.db}"
        self.record = home / "record.txt"
        self.cwd = home / "cwd"
        self.cwd.mkdir()

    def env(self, **changes: str | None) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("CRAWLQ_")}
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
        env["CRAWLQ_BACKEND"] = self.url
        env["CRAWLQ_TEST_RECORD"] = str(self.record)
        env["CRAWLQ_TEST_PAGES"] = str(PAGES)
        for name, value in changes.items():
            if value is None:
                env.pop(name, None)
            else:
                env[name] = value
        return env

    def run(
        self,
        *args: str,
        stdin: str | None = None,
        env: dict[str, str] | None = None,
        program: Sequence[str] = (sys.executable, "-m", "crawlq"),
    ) -> Ran:
        with subprocess.Popen(
            [*program, *args],
            cwd=self.cwd,
            env=env or self.env(),
            stdin=subprocess.PIPE if stdin is not None else subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        ) as proc:
            try:
                out, err = proc.communicate(stdin, timeout=TIMEOUT)
            except subprocess.TimeoutExpired:
                proc.kill()
                out, err = proc.communicate()
                stuck = Ran(args=args, pid=proc.pid, code=-9, out=out, err=err)
                pytest.fail(f"still running after {TIMEOUT:g} s, killed: {stuck}")
        return Ran(args=args, pid=proc.pid, code=proc.returncode, out=out, err=err)

    def ok(self, *args: str, stdin: str | None = None, env: dict[str, str] | None = None) -> Ran:
        ran = self.run(*args, stdin=stdin, env=env)
        assert ran.code == 0, ran
        assert "Traceback" not in ran.err, ran
        return ran

    def refused(
        self, *args: str, stdin: str | None = None, env: dict[str, str] | None = None
    ) -> str:
        """Runs a command that must fail cleanly; returns its one line of stderr."""
        ran = self.run(*args, stdin=stdin, env=env)
        assert ran.code != 0, ran
        assert "Traceback" not in ran.err + ran.out, ran
        lines = ran.err.strip().splitlines()
        assert len(lines) == 1, ran
        assert ran.out == "", ran
        return lines[0]

    def stats(self) -> dict[str, Any]:
        stats: dict[str, Any] = json.loads(self.ok("stats", "--json").out)
        return stats

    def queues(self) -> dict[str, dict[str, int]]:
        return {q.pop("name"): q for q in self.stats()["queues"]}

    def queue(self, name: str) -> dict[str, int]:
        return self.queues()[name]

    def groups(self) -> dict[str, dict[str, Any]]:
        return {g["name"]: g for g in self.stats()["groups"]}

    def limits(self) -> dict[str, dict[str, Any]]:
        rules = json.loads(self.ok("limits", "list", "--json").out)["rules"]
        return {r["pattern"]: r["limit"] for r in rules}

    def dead(self, queue: str) -> list[dict[str, Any]]:
        letters: list[dict[str, Any]] = json.loads(self.ok("dead", "list", queue, "--json").out)
        return letters

    def state(self) -> tuple[Any, ...]:
        """Everything a refused command must leave as it was (dead counts are in the queues)."""
        stats = self.stats()
        return stats["queues"], stats["groups"], self.limits()

    def records(self) -> list[tuple[int, str]]:
        """(pid, what ran) for every task run, in the order they were recorded."""
        if not self.record.exists():
            return []
        lines = self.record.read_text().splitlines()
        return [(int(pid), what) for pid, _, what in (line.partition(" ") for line in lines)]

    def ran(self) -> Counter[str]:
        return Counter(what for _, what in self.records())


def empty(**given: int) -> dict[str, int]:
    return {"total": 0, "due": 0, "delayed": 0, "running": 0, "dead": 0, **given}


@pytest.fixture
def cli(tmp_path: Path) -> Cli:
    return Cli(tmp_path)


@pytest.fixture
def started(cli: Cli) -> Cli:
    """A database made by `crawlq start`: the app's queues and limits stored, one seed queued."""
    assert report(cli.ok("start", APP)) == counts(added=1)
    return cli


# -- help -------------------------------------------------------------------------------------

WITH_BACKEND = [
    "schedule",
    "stats",
    "dead list",
    "dead requeue",
    "dead purge",
    "limits",
]
WITHOUT_BACKEND = [
    "",
    "worker",
    "start",
    "demo",
    "dead",
    "limits list",
    "limits set",
    "limits delete",
    "limits block",
    "limits unblock",
]


@pytest.mark.parametrize("command", WITH_BACKEND + WITHOUT_BACKEND)
def test_help_of_every_command(cli: Cli, command: str) -> None:
    ran = cli.ok(*command.split(), "--help")
    assert ran.out.startswith(f"Usage: crawlq {command}".rstrip() + " "), ran
    assert ran.err == "", ran
    if command in WITH_BACKEND:
        assert "--backend" in ran.out, ran
        assert "CRAWLQ_BACKEND" in ran.out, ran
    assert not (cli.cwd / "crawlq.db").exists()


def test_every_option_of_every_command_says_what_it_does() -> None:
    """`--help` leaves no option bare: dead list's --limit and --offset, limits list's --json
    and limits block's --reason showed only their type."""

    def commands(command: click.Command, path: str) -> list[tuple[str, click.Command]]:
        found = [(path, command)]
        if isinstance(command, click.Group):
            for name, sub in command.commands.items():
                found += commands(sub, f"{path} {name}")
        return found

    bare = [
        f"{path} {'/'.join(param.opts)}"
        for path, command in commands(command_line, "crawlq")
        for param in command.params
        if isinstance(param, click.Option) and not param.help
    ]
    assert bare == []


@pytest.mark.parametrize("group", ["", "dead", "limits", "warc"])
def test_command_lists_are_whole_sentences_on_an_80_column_terminal(cli: Cli, group: str) -> None:
    """A command's line in its group's --help was its docstring cut at ~60 characters, ending
    mid-phrase ("Serve the web dashboard and /metrics for a backend (or...")."""
    ran = cli.run(*group.split(), "--help", env=cli.env(COLUMNS="80"))
    assert ran.code == 0, ran
    commands = ran.out.split("Commands:\n", 1)[1].splitlines()
    assert commands and all(not line.endswith("...") for line in commands), ran.out


def test_entry_point_script(cli: Cli) -> None:
    script = Path(sys.executable).with_name("crawlq")
    if not script.exists():
        pytest.skip(f"no crawlq script next to {sys.executable}")
    ran = cli.run("--version", program=[str(script)])
    assert ran.code == 0, ran
    assert "0.1.0" in ran.out, ran
    ran = cli.run("-h", program=[str(script)])
    assert ran.code == 0, ran
    for command in ["worker", "start", "schedule", "stats", "dead", "limits", "demo"]:
        assert re.search(rf"^  {command}\b", ran.out, re.MULTILINE), ran


# -- bad input: one line on stderr, a non-zero exit, nothing changed -------------------------


@pytest.mark.parametrize(
    ("args", "stdin", "named"),
    [
        (["not json"], None, "'not json'"),
        (['"http://a.example.test/ok"', "{'single': 'quotes'}"], None, "{'single': 'quotes'}"),
        (["--file", "-"], '"http://a.example.test/ok"\n[1, 2\n', "'[1, 2'"),
    ],
    ids=["alone", "in-a-batch", "in-a-file"],
)
def test_non_json_element_is_refused(
    started: Cli, args: list[str], stdin: str | None, named: str
) -> None:
    before = started.state()
    line = started.refused("schedule", "fetch", *args, stdin=stdin)
    assert line.startswith("Error: "), line
    assert "not JSON" in line, line
    assert named in line, line
    assert started.state() == before


@pytest.mark.parametrize(
    "args",
    [
        ["schedule", "nosuch", '"http://a.example.test/1"'],
        ["schedule", "nosuch", '"http://a.example.test/1"', "--app", APP],
        ["dead", "list", "nosuch"],
        ["dead", "requeue", "nosuch", "--all"],
        ["dead", "purge", "nosuch", '{"boom":1}'],
        ["worker", APP, "--queue", "nosuch", "--burst"],
    ],
    ids=lambda args: " ".join(args[:2]) + (" --app" if "--app" in args else ""),
)
def test_unknown_queue_is_refused(started: Cli, args: list[str]) -> None:
    before = started.state()
    line = started.refused(*args)
    assert "nosuch" in line, line
    assert started.state() == before


@pytest.mark.parametrize(
    ("args", "named"),
    [
        (['"ftp://a.example.test/file"'], "ftp://a.example.test/file"),
        (['"http://"'], "'http://'"),
        (['"http://[::1/page"'], "http://[::1/page"),
        (['"/relative/page"'], "/relative/page"),
        (['{"url": "mailto:someone@a.example.test"}'], "mailto:someone@a.example.test"),
        (["--text", "a.example.test/no-scheme"], "a.example.test/no-scheme"),
        (['"http://a.example.test/fine"', '"https:///no-host"'], "https:///no-host"),
    ],
    ids=["ftp", "no-host", "bad-ipv6", "relative", "url-field", "text", "in-a-batch"],
)
def test_invalid_url_for_a_host_grouped_queue_is_refused(
    started: Cli, args: list[str], named: str
) -> None:
    before = started.state()
    line = started.refused("schedule", "fetch", *args)
    assert "fetch" in line, line
    assert named in line, line
    assert started.state() == before


@pytest.mark.parametrize(
    ("args", "named"),
    [
        (["--concurrency", "0"], "concurrency"),
        (["--concurrency", "-3"], "concurrency"),
        (["--concurrency", "2", "--interval", "-1"], "interval"),
    ],
    ids=["concurrency-0", "concurrency-negative", "interval-negative"],
)
def test_limit_out_of_range_is_refused(started: Cli, args: list[str], named: str) -> None:
    before = started.state()
    line = started.refused("limits", "set", "*.example.test", *args)
    assert named in line, line
    assert "*.example.test" in line, line
    assert started.state() == before


def test_exclusive_schedule_options_are_refused(started: Cli) -> None:
    before = started.state()
    line = started.refused(
        "schedule", "fetch", '"http://a.example.test/1"', "--only-if-new", "--only-if-earlier"
    )
    assert "only_if_earlier" in line or "--only-if-earlier" in line, line
    assert started.state() == before


@pytest.mark.parametrize(
    ("args", "named"),
    [
        (["schedule", "normalize", '{"page": "p"}', "--priority", str(10**30)], ["priority"]),
        (["schedule", "normalize", '{"page": "p"}', "--delay", "nan"], ["delay"]),
        (["limits", "set", "x.example.test", "--interval", "nan"], ["interval"]),
        (["limits", "block", "a.example.test", "--for", "nan"], ["--for", "seconds"]),
    ],
    ids=["priority-overflow", "delay-nan", "interval-nan", "block-for-nan"],
)
def test_unusable_number_is_refused(started: Cli, args: list[str], named: list[str]) -> None:
    """Numbers click accepts but the queue cannot store: refused, naming the option."""
    started.ok("schedule", "fetch", '"http://a.example.test/queued"')
    before = started.state()
    line = started.refused(*args)
    assert any(word in line for word in named), line
    assert "constraint" not in line, f"a database error is not a clear answer: {line}"
    assert started.state() == before


def test_bad_module_is_refused(started: Cli) -> None:
    for command in (["worker", "--burst"], ["start"]):
        line = started.refused(command[0], "tests.apps.nosuch:app", *command[1:])
        assert "tests.apps.nosuch" in line, line
        line = started.refused(command[0], "tests.apps.cli_app:nothing", *command[1:])
        assert "tests.apps.cli_app:nothing" in line, line
    assert started.queue("seed") == empty(total=1, due=1)
    assert started.ran() == Counter()


def test_usage_errors_exit_2_without_traceback(started: Cli) -> None:
    before = started.state()
    for args, named in [
        (["schedule", "fetch"], "ELEMENT"),
        (["schedule", "fetch", "--file", str(started.home / "missing.jsonl")], "missing.jsonl"),
        (["dead", "requeue", "explode"], "--all"),
        (["dead", "purge", "explode"], "--all"),
        (["start", APP, "nosuch"], "nosuch"),
        (["worker", APP, "--processes", "0"], "--processes"),
    ]:
        ran = started.run(*args)
        assert ran.code == 2, ran
        assert "Traceback" not in ran.err, ran
        error = [line for line in ran.err.splitlines() if line.startswith("Error:")]
        assert len(error) == 1, ran
        assert named in error[0], ran
    assert started.state() == before


# -- bad backends -----------------------------------------------------------------------------

BACKEND_KINDS = ["missing-file", "missing-folder", "a-folder", "random-bytes", "foreign-sqlite"]


def make_bad_backend(home: Path, kind: str) -> tuple[Path, str]:
    """A path for --backend, and the words the one-line error must contain."""
    if kind == "missing-file":
        return home / "missing.db", "no crawlq database"
    if kind == "missing-folder":
        return home / "no-such-folder" / "queue.db", "no such folder"
    if kind == "a-folder":
        (home / "folder.db").mkdir()
        return home / "folder.db", "folder"
    if kind == "random-bytes":
        path = home / "corrupt.db"
        path.write_bytes(bytes(range(256)) * 16 + os.urandom(4096))
        return path, "not a SQLite database"
    if kind == "foreign-sqlite":
        path = home / "foreign.db"
        with closing(sqlite3.connect(path)) as db:
            db.execute("CREATE TABLE orders (id INTEGER PRIMARY KEY, item TEXT)")
            db.execute("INSERT INTO orders (item) VALUES ('tea'), ('cake')")
            db.commit()
        return path, "not crawlq's"
    raise AssertionError(kind)


def with_backend(url: str, *args: str) -> list[str]:
    """`limits` takes --backend before its subcommand; every other command after its args."""
    if args[0] == "limits":
        return ["limits", "--backend", url, *args[1:]]
    return [*args, "--backend", url]


def snapshot(folder: Path) -> dict[str, bytes | None]:
    return {
        str(p.relative_to(folder)): None if p.is_dir() else p.read_bytes()
        for p in sorted(folder.rglob("*"))
    }


BACKEND_COMMANDS = [
    ("stats", "--json"),
    ("schedule", "fetch", '"http://a.example.test/1"'),
    ("dead", "requeue", "explode", "--all"),
    ("limits", "list"),
    ("limits", "block", "a.example.test", "--for", "60"),
]


@pytest.mark.parametrize("kind", BACKEND_KINDS)
@pytest.mark.parametrize("command", BACKEND_COMMANDS, ids=" ".join)
def test_bad_backend_is_refused(cli: Cli, kind: str, command: tuple[str, ...]) -> None:
    path, problem = make_bad_backend(cli.home, kind)
    files = snapshot(cli.home)
    line = cli.refused(*with_backend(f"sqlite:///{path}", *command))
    assert str(path) in line, line
    assert problem in line, line
    if kind != "foreign-sqlite":  # see test_foreign_sqlite_database_is_left_untouched
        assert snapshot(cli.home) == files, "a refused backend was created or changed"
    else:
        assert sorted(set(snapshot(cli.home)) - set(files)) == [], "files were left behind"
        with closing(sqlite3.connect(path)) as db:
            tables = [r[0] for r in db.execute("SELECT name FROM sqlite_master")]
            assert tables == ["orders"]
            assert db.execute("SELECT item FROM orders ORDER BY id").fetchall() == [
                ("tea",),
                ("cake",),
            ]


@pytest.mark.parametrize(
    "command", [("stats",), ("start", APP), ("worker", APP, "--burst")], ids=lambda c: c[0]
)
def test_foreign_sqlite_database_is_left_untouched(cli: Cli, command: tuple[str, ...]) -> None:
    """Refusing another program's SQLite file must not rewrite it (not even its journal mode)."""
    path, problem = make_bad_backend(cli.home, "foreign-sqlite")
    original = path.read_bytes()
    line = cli.refused(*command, env=cli.env(CRAWLQ_BACKEND=f"sqlite:///{path}"))
    assert problem in line, line
    assert sorted(p.name for p in cli.home.iterdir()) == ["cwd", "foreign.db"]
    with closing(sqlite3.connect(path)) as db:
        assert db.execute("PRAGMA journal_mode").fetchone()[0] == "delete"
    assert path.read_bytes() == original, "crawlq changed a database it refused"


def test_backend_from_environment_and_default(cli: Cli) -> None:
    """No --backend: CRAWLQ_BACKEND decides; without it, sqlite:///crawlq.db in the cwd."""
    line = cli.refused("stats")
    assert str(cli.db) in line, line
    line = cli.refused("stats", env=cli.env(CRAWLQ_BACKEND=None))
    assert "crawlq.db" in line, line
    line = cli.refused("limits", "set", "*", "--concurrency", "1", env=cli.env(CRAWLQ_BACKEND=None))
    assert "crawlq.db" in line, line
    assert sorted(p.name for p in cli.home.iterdir()) == ["cwd"]
    assert list(cli.cwd.iterdir()) == []


@pytest.mark.parametrize(
    "url", ["redis://127.0.0.1:1/0", "postgresql://localhost/q", "mysql://x", "sqlite://"]
)
def test_unusable_backend_url_is_refused(cli: Cli, url: str) -> None:
    line = cli.refused("stats", "--backend", url)
    assert url.partition(":")[0] in line, line
    assert list(cli.cwd.iterdir()) == []


# -- start and worker -------------------------------------------------------------------------


def test_start_then_burst_worker_runs_everything_once(started: Cli) -> None:
    queues = started.queues()
    assert queues == {
        "explode": empty(),
        "fetch": empty(),
        "normalize": empty(),
        "seed": empty(total=1, due=1),
    }

    ran = started.ok("worker", APP, "--burst")
    assert summaries(ran) == [(2 * PAGES + 1, 2, 1, 0)], ran
    assert started.ran() == everything_once()
    assert {pid for pid, _ in started.records()} == {ran.pid}

    stats = started.stats()
    assert stats["workers"] == []
    assert stats["groups"] == []
    assert {q.pop("name"): q for q in stats["queues"]} == {
        "explode": empty(dead=1),
        "fetch": empty(),
        "normalize": empty(),
        "seed": empty(),
    }

    table = started.ok("stats").out
    lines = table.splitlines()
    assert lines[0].split() == ["queue", "total", "due", "delayed", "running", "dead"], table
    assert [line.split()[0] for line in lines[1:5]] == QUEUES, table
    assert lines[1].split() == ["explode", "0", "0", "0", "0", "1"], table
    assert "no live workers" in table

    # nothing is left: a second burst runs nothing and exits at once
    ran = started.ok("worker", APP, "--burst")
    assert summaries(ran) == [(0, 0, 0, 0)], ran
    assert started.ran() == everything_once()


def test_start_named_task_with_element(started: Cli) -> None:
    url = "http://b.example.test/start"
    ran = started.ok("start", APP, "fetch", "--element", json.dumps(url))
    assert report(ran) == counts(added=1)
    assert started.queue("fetch") == empty(total=1, due=1)
    assert started.groups()["b.example.test"]["queued"] == 1
    line = started.refused("start", APP, "fetch", "--element", "{oops")
    assert "{oops" in line, line
    # again: the seed already queued is moved, not duplicated
    assert report(started.ok("start", APP)) == counts(moved=1)
    assert started.queue("seed") == empty(total=1, due=1)


def test_worker_with_two_processes(started: Cli) -> None:
    ran = started.ok("worker", APP, "--processes", "2", "--burst")
    processes = summaries(ran)
    assert len(processes) == 2, ran
    assert sum(p[0] for p in processes) == 2 * PAGES + 1, ran
    assert sum(p[2] for p in processes) == 1, ran
    assert started.ran() == everything_once()
    pids = {pid for pid, _ in started.records()}
    assert ran.pid not in pids, "the supervisor ran tasks itself"
    assert 1 <= len(pids) <= 2
    stats = started.stats()
    assert stats["workers"] == []
    assert {q["name"]: q["total"] for q in stats["queues"]} == dict.fromkeys(QUEUES, 0)
    assert started.queue("explode") == empty(dead=1)


def test_worker_runs_only_the_queues_named(started: Cli) -> None:
    started.ok("schedule", "normalize", '{"page": "only"}')
    ran = started.ok("worker", APP, "--queue", "normalize", "--burst")
    assert summaries(ran) == [(1, 0, 0, 0)], ran
    assert started.ran() == Counter(["normalize only"])
    assert started.queue("seed") == empty(total=1, due=1)


def test_burst_worker_exits_when_due_work_is_blocked(started: Cli) -> None:
    """--burst: "exit once nothing is left to run". A group blocked for 10 minutes has
    nothing to run, like an element delayed for 10 minutes: the worker must exit, not wait."""
    started.ok("schedule", "fetch", '"http://a.example.test/blocked"')
    started.ok("limits", "block", "a.example.test", "--for", "600")
    ran = started.ok("worker", APP, "--queue", "fetch", "--burst")
    assert summaries(ran) == [(0, 0, 0, 0)], ran
    assert started.ran() == Counter()
    assert started.queue("fetch")["total"] == 1


# -- schedule ---------------------------------------------------------------------------------


def test_schedule_the_same_element_three_times_leaves_one(started: Cli) -> None:
    url = '"http://a.example.test/same"'
    assert report(started.ok("schedule", "fetch", url)) == counts(added=1)
    assert report(started.ok("schedule", "fetch", url)) == counts(moved=1)
    assert report(started.ok("schedule", "fetch", url)) == counts(moved=1)
    assert started.queue("fetch") == empty(total=1, due=1)
    assert started.groups()["a.example.test"]["queued"] == 1

    # three times in one command, and spelled differently: still one
    assert report(started.ok("schedule", "fetch", url, url, url)) == counts(moved=1)
    other = '{"page": "x", "n": [1, 2]}'
    assert report(started.ok("schedule", "normalize", other)) == counts(added=1)
    respelled = '{ "n" : [1,2],\n"page":"x" }'
    assert report(started.ok("schedule", "normalize", respelled)) == counts(moved=1)
    assert started.queue("fetch") == empty(total=1, due=1)
    assert started.queue("normalize") == empty(total=1, due=1)


def test_schedule_delay_and_only_if_options(started: Cli) -> None:
    element = '{"page": "e"}'

    def schedule(*options: str) -> dict[str, int]:
        return report(started.ok("schedule", "normalize", element, *options))

    assert schedule("--delay", "3600") == counts(added=1)
    assert started.queue("normalize") == empty(total=1, delayed=1)
    assert schedule("--only-if-new") == counts(kept=1)
    assert started.queue("normalize") == empty(total=1, delayed=1)
    assert schedule("--only-if-earlier", "--delay", "7200") == counts(kept=1)
    assert started.queue("normalize") == empty(total=1, delayed=1)
    assert schedule("--only-if-earlier") == counts(moved=1)
    assert started.queue("normalize") == empty(total=1, due=1)
    assert schedule("--only-if-new", "--delay", "3600") == counts(kept=1)
    assert started.queue("normalize") == empty(total=1, due=1)
    assert schedule("--only-if-earlier", "--delay", "60") == counts(kept=1)
    assert started.queue("normalize") == empty(total=1, due=1)
    assert schedule("--delay", "3600") == counts(moved=1)  # plain: moves it later too
    assert started.queue("normalize") == empty(total=1, delayed=1)
    assert schedule("--only-if-new", "--priority", "7") == counts(kept=1)
    assert started.queue("normalize") == empty(total=1, delayed=1)
    # a new element with --only-if-new is added
    only_new = report(started.ok("schedule", "normalize", '{"page": "f"}', "--only-if-new"))
    assert only_new == counts(added=1)
    assert started.queue("normalize") == empty(total=2, due=1, delayed=1)


def test_schedule_priority_and_due_time_set_the_order(started: Cli) -> None:
    """Higher priority first, then earlier due time; delayed elements wait past a burst."""
    for page, options in [
        ("low", []),
        ("mid", ["--priority", "1"]),
        ("high", ["--priority", "5"]),
        ("overdue", ["--priority", "1", "--delay=-30"]),
        ("later", ["--priority", "9", "--delay", "3600"]),
    ]:
        ran = started.ok("schedule", "normalize", json.dumps({"page": page}), *options)
        assert report(ran) == counts(added=1)
    assert started.queue("normalize") == empty(total=5, due=4, delayed=1)

    ran = started.ok("worker", APP, "--queue", "normalize", "--concurrency", "1", "--burst")
    assert summaries(ran) == [(4, 0, 0, 0)], ran
    order = [what for _, what in started.records()]
    assert order == ["normalize high", "normalize overdue", "normalize mid", "normalize low"]
    assert started.queue("normalize") == empty(total=1, delayed=1)

    # moving the delayed one to now (its priority too) lets the next burst run it
    ran = started.ok("schedule", "normalize", '{"page": "later"}', "--only-if-earlier")
    assert report(ran) == counts(moved=1)
    started.ok("worker", APP, "--queue", "normalize", "--burst")
    assert [what for _, what in started.records()][-1] == "normalize later"
    assert started.queue("normalize") == empty()


def test_schedule_text_and_file(started: Cli) -> None:
    ran = started.ok(
        "schedule", "fetch", "--text", "http://b.example.test/1", "http://b.example.test/2"
    )
    assert report(ran) == counts(added=2)
    # the same URL as a JSON string is the same element
    assert report(started.ok("schedule", "fetch", '"http://b.example.test/1"')) == counts(moved=1)

    lines = started.home / "elements.jsonl"
    lines.write_text(
        '"http://c.example.test/1"\n\n{"url": "http://c.example.test/2", "depth": 1}\n   \n'
    )
    assert report(started.ok("schedule", "fetch", "--file", str(lines))) == counts(added=2)
    assert started.queue("fetch") == empty(total=4, due=4)
    assert started.groups()["c.example.test"]["queued"] == 2

    ran = started.ok("schedule", "fetch", "--file", "-", "--delay", "600", stdin=lines.read_text())
    assert report(ran) == counts(moved=2)
    assert started.queue("fetch") == empty(total=4, due=2, delayed=2)

    urls = started.home / "urls.txt"
    urls.write_text("http://d.example.test/1\nhttp://d.example.test/2\n\n")
    ran = started.ok("schedule", "fetch", "--text", "--file", str(urls), "http://d.example.test/0")
    assert report(ran) == counts(added=3)
    assert started.groups()["d.example.test"]["queued"] == 3
    assert started.queue("fetch") == empty(total=7, due=5, delayed=2)


def test_schedule_without_app_uses_stored_queue_config(started: Cli) -> None:
    """`schedule` without --app groups by the stored config: fetch by host, normalize by none."""
    started.ok("schedule", "fetch", '"http://A.Example.TEST/case"')
    started.ok("schedule", "normalize", '{"url": "http://b.example.test/not-grouped"}')
    groups = started.groups()
    assert set(groups) == {"a.example.test"}
    assert groups["a.example.test"]["queued"] == 1
    ran = started.ok("schedule", "fetch", '"http://a.example.test/app"', "--app", APP)
    assert report(ran) == counts(added=1)
    assert started.groups()["a.example.test"]["queued"] == 2


def test_seen_queue_skips_finished_urls_unless_revisit(started: Cli) -> None:
    url = '"http://a.example.test/seen"'
    started.ok("schedule", "fetch", url)
    started.ok("worker", APP, "--queue", "fetch", "--queue", "normalize", "--burst")
    assert started.ran() == Counter(
        ["fetch http://a.example.test/seen", "normalize http://a.example.test/seen"]
    )
    assert report(started.ok("schedule", "fetch", url)) == counts(skipped=1)
    assert started.queue("fetch") == empty()
    assert report(started.ok("schedule", "fetch", url, "--revisit")) == counts(added=1)
    assert started.queue("fetch") == empty(total=1, due=1)


# -- dead letters -----------------------------------------------------------------------------


def test_dead_list_requeue_purge(started: Cli) -> None:
    keys = ['{"boom":1}', '{"boom":2}', '{"boom":3}']
    assert report(started.ok("schedule", "explode", *keys)) == counts(added=3)
    ran = started.ok("worker", APP, "--queue", "explode", "--burst")
    assert summaries(ran) == [(0, 6, 3, 0)], ran
    assert started.ran() == Counter(f"explode {k} attempt {n}" for k in keys for n in (1, 2))
    assert started.queue("explode") == empty(dead=3)

    listed = started.ok("dead", "list", "explode").out
    for key in keys:
        assert key in listed, listed
    assert listed.count("attempts=2") == 3, listed
    assert listed.count("RuntimeError: always fails") == 3, listed
    assert started.ok("dead", "list", "explode", "--limit", "1").out.count("attempts=") == 1
    assert started.ok("dead", "list", "fetch").out.strip() == "no dead elements in fetch"

    letters = started.dead("explode")
    assert sorted(d["key"] for d in letters) == keys
    for letter in letters:
        assert letter["queue"] == "explode"
        assert letter["attempts"] == 2
        assert letter["payload"] == letter["key"]
        assert letter["error"].startswith("RuntimeError: always fails"), letter
        assert "Traceback" in letter["traceback"], letter
        assert 'raise RuntimeError(f"always fails: {element}")' in letter["traceback"], letter
    assert started.dead("fetch") == []

    assert started.ok("dead", "requeue", "explode", keys[1]).out.strip() == "requeued 1"
    assert started.queue("explode") == empty(total=1, due=1, dead=2)
    again = started.run("dead", "requeue", "explode", keys[1])  # queued now, not dead
    assert (again.code, again.out.strip()) == (1, ""), again
    assert f"not dead in explode: {keys[1]!r}" in again.err, again
    assert started.queue("explode") == empty(total=1, due=1, dead=2)

    # the re-queued element gets fresh attempts, and dies again
    ran = started.ok("worker", APP, "--queue", "explode", "--burst")
    assert summaries(ran) == [(0, 2, 1, 0)], ran
    assert started.ran()[f"explode {keys[1]} attempt 1"] == 2
    assert started.ran()[f"explode {keys[1]} attempt 2"] == 2
    assert started.queue("explode") == empty(dead=3)

    assert started.ok("dead", "requeue", "explode", "--all").out.strip() == "requeued 3"
    assert started.queue("explode") == empty(total=3, due=3)
    assert started.dead("explode") == []
    started.ok("worker", APP, "--queue", "explode", "--burst")
    assert started.queue("explode") == empty(dead=3)

    assert started.ok("dead", "purge", "explode", keys[0]).out.strip() == "purged 1"
    assert started.queue("explode") == empty(dead=2)
    assert sorted(d["key"] for d in started.dead("explode")) == keys[1:]
    assert started.ok("dead", "purge", "explode", "--all").out.strip() == "purged 2"
    assert started.queue("explode") == empty()
    assert started.ok("dead", "purge", "explode", "--all").out.strip() == "purged 0"
    assert started.ok("dead", "list", "explode").out.strip() == "no dead elements in explode"


# -- limits -----------------------------------------------------------------------------------


def test_limits_set_list_delete(started: Cli) -> None:
    default = {"*": {"concurrency": 4, "interval": 0.0}}
    app_rule = {"*.example.test": {"concurrency": 2, "interval": 0.0}}
    assert started.limits() == {**default, **app_rule}
    table = started.ok("limits").out  # no subcommand: the list
    assert table.splitlines()[0].split() == ["pattern", "concurrency", "interval", "set", "by"]
    assert "*.example.test" in table
    assert started.ok("limits", "--app", APP, "list").out == table

    ran = started.ok("limits", "set", "*.foo.test", "--concurrency", "3", "--interval", "1.5")
    assert ran.out.strip() == "*.foo.test: 3 at once, 1.5s apart"
    assert started.limits()["*.foo.test"] == {"concurrency": 3, "interval": 1.5}
    ran = started.ok("limits", "set", "*.foo.test", "--concurrency", "1")
    assert ran.out.strip() == "*.foo.test: 1 at once, 0s apart"
    assert started.limits()["*.foo.test"] == {"concurrency": 1, "interval": 0.0}
    ran = started.ok("limits", "set", "bar.test", "--interval", "2")
    assert ran.out.strip() == "bar.test: unlimited at once, 2s apart"
    assert started.limits()["bar.test"] == {"concurrency": None, "interval": 2.0}

    # the most specific rule applies to a group at once
    started.ok("schedule", "fetch", '"http://a.example.test/1"')
    assert started.groups()["a.example.test"]["limit"] == app_rule["*.example.test"]
    started.ok("limits", "set", "a.example.test", "--concurrency", "1", "--interval", "2")
    assert started.groups()["a.example.test"]["limit"] == {"concurrency": 1, "interval": 2.0}

    assert started.ok("limits", "delete", "a.example.test").out.strip() == "deleted a.example.test"
    assert started.groups()["a.example.test"]["limit"] == app_rule["*.example.test"]
    assert "a.example.test" not in started.limits()
    before = started.state()
    line = started.refused("limits", "delete", "a.example.test")
    assert "a.example.test" in line, line
    assert started.state() == before

    started.ok("limits", "delete", "*.foo.test")
    started.ok("limits", "delete", "bar.test")
    assert started.limits() == {**default, **app_rule}


def test_an_operators_rule_outlasts_the_apps_until_deleted(started: Cli) -> None:
    """A host slowed down by hand stays slow when a worker of the app starts (and stores the
    app's rules again); deleting the rule with the app named gives the app's back at once."""
    slowed = {"concurrency": 1, "interval": 3.0}
    started.ok("limits", "set", "*.example.test", "--concurrency", "1", "--interval", "3")
    started.ok("schedule", "fetch", '"http://a.example.test/1"')
    started.ok("start", APP)  # stores the app's queues and rules, as a worker does
    assert started.limits()["*.example.test"] == slowed
    assert started.groups()["a.example.test"]["limit"] == slowed
    rows = [line.split() for line in started.ok("limits").out.splitlines()]
    assert ["*.example.test", "1", "3s", "operator"] in rows

    ran = started.ok("limits", "delete", "*.example.test", "--app", APP)
    assert ran.out.strip() == "deleted *.example.test; the app's rule is back: 2 at once, 0s apart"
    assert started.groups()["a.example.test"]["limit"] == {"concurrency": 2, "interval": 0.0}


def test_limits_list_the_crawl_delays_and_delete_takes_one_away(started: Cli) -> None:
    started.ok("schedule", "fetch", '"http://a.example.test/1"')
    started.ok("limits", "set", "*.example.test", "--concurrency", "1")

    async def crawl_reads_robots_txt() -> None:
        async with connected(started.url) as backend:
            await backend.raise_crawl_delays({"a.example.test": 2.5})

    asyncio.run(crawl_reads_robots_txt())
    rows = [re.split(r"\s{2,}", line.strip()) for line in started.ok("limits").out.splitlines()]
    assert ["*.example.test", "1", "0s", "operator"] in rows
    assert ["a.example.test", "by rule", "at least 2.5s", "robots.txt"] in rows
    listed = json.loads(started.ok("limits", "list", "--json").out)
    assert listed["crawl_delays"] == {"a.example.test": 2.5}
    assert started.groups()["a.example.test"]["limit"] == {"concurrency": 1, "interval": 2.5}

    assert started.ok("limits", "delete", "a.example.test").out.strip() == "deleted a.example.test"
    assert json.loads(started.ok("limits", "list", "--json").out)["crawl_delays"] == {}
    assert started.groups()["a.example.test"]["limit"] == {"concurrency": 1, "interval": 0.0}


def test_limits_delete_accepts_the_pattern_given_to_set(started: Cli) -> None:
    ran = started.ok("limits", "set", "Shop.Example.TEST", "--concurrency", "1")
    assert ran.out.strip() == "shop.example.test: 1 at once, 0s apart"
    started.ok("limits", "delete", "Shop.Example.TEST")
    assert "shop.example.test" not in started.limits()


def test_limits_block_and_unblock(started: Cli) -> None:
    started.ok("schedule", "fetch", '"http://a.example.test/1"', '"http://b.example.test/1"')
    assert started.groups()["a.example.test"]["block_reason"] is None

    ran = started.ok(
        "limits", "block", "a.example.test", "--for", "600", "--reason", "asked us to stop"
    )
    assert ran.out.strip() == "a.example.test blocked for 600s"
    groups = started.groups()
    assert groups["a.example.test"]["block_reason"] == "asked us to stop"
    assert groups["a.example.test"]["blocked_until"] > time.time() + 300
    assert groups["a.example.test"]["queued"] == 1
    assert groups["b.example.test"]["block_reason"] is None
    assert groups["b.example.test"]["blocked_until"] is None
    table = started.ok("stats").out
    blocked_row = next(line for line in table.splitlines() if line.startswith("a.example.test"))
    assert "asked us to stop" in blocked_row, table

    started.ok("limits", "block", "b.example.test", "--for", "600")
    assert started.groups()["b.example.test"]["block_reason"] == "blocked by hand"

    ran = started.ok("limits", "unblock", "a.example.test")
    assert ran.out.strip() == "a.example.test unblocked"
    groups = started.groups()
    assert groups["a.example.test"]["block_reason"] is None
    assert groups["a.example.test"]["blocked_until"] is None
    assert groups["b.example.test"]["block_reason"] == "blocked by hand"
    started.ok("limits", "unblock", "b.example.test")

    ran = started.ok("worker", APP, "--queue", "fetch", "--queue", "normalize", "--burst")
    assert summaries(ran) == [(4, 0, 0, 0)], ran
    assert started.ran()["fetch http://a.example.test/1"] == 1
    assert started.queue("fetch") == empty()


def test_limits_take_the_backend_before_or_after_the_subcommand(started: Cli) -> None:
    other = started.home / "other"
    other.mkdir()
    url = f"sqlite:///{other / 'queue.db'}"
    env = started.env(CRAWLQ_BACKEND=None)
    started.ok("start", APP, env=started.env(CRAWLQ_BACKEND=url))  # creates the other db
    started.ok("limits", "set", "after.test", "--concurrency", "3", "--backend", url, env=env)
    started.ok("limits", "--backend", url, "set", "before.test", "--concurrency", "5", env=env)
    listed = started.ok("limits", "list", "--json", "--backend", url, env=env).out
    rules = json.loads(listed)["rules"]
    patterns = {r["pattern"] for r in rules}
    assert {"after.test", "before.test"} <= patterns
    assert "after.test" not in started.limits()  # the test's own database is untouched


def test_dead_keys_match_whatever_their_json_spelling(started: Cli) -> None:
    started.ok("schedule", "explode", '{"boom":1,"at":"x"}')
    started.ok("worker", APP, "--queue", "explode", "--burst")
    assert started.queue("explode") == empty(dead=1)
    respelled = '{ "at": "x",  "boom": 1 }'
    assert started.ok("dead", "requeue", "explode", respelled).out.strip() == "requeued 1"
    assert started.queue("explode") == empty(total=1, due=1)


def test_schedule_with_an_app_creates_the_database(cli: Cli) -> None:
    assert not cli.db.exists()
    ran = cli.ok("schedule", "normalize", '{"page":"p"}', "--app", APP)
    assert report(ran) == counts(added=1)
    assert cli.queue("normalize") == empty(total=1, due=1)


# -- check ------------------------------------------------------------------------------------


def test_check_says_consistent_then_names_damage(started: Cli) -> None:
    import sqlite3

    assert "consistent" in started.ok("check", "--backend", started.url).out
    with sqlite3.connect(started.db) as db:
        db.execute("UPDATE counts SET n = n + 5 WHERE state = 1")
    ran = started.run("check", "--backend", started.url)
    assert ran.code == 1, ran
    assert "count of state 1 is" in ran.out, ran
