"""A nightly pipeline (tests/apps/pipeline_app.py) run by real `crawlq` processes on real
SQLite files, killed (SIGKILL) at points the test chooses: a stage or an export held on a
marker file, never a timer. Waits are bounded polls for a condition."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sqlite3
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from crawlq.results import ResultsStore

from .test_worker_processes import finish, wait_for

ROOT = Path(__file__).resolve().parent.parent
APP = "tests.apps.pipeline_app:app"
URLS = [f"http://shop.test/{n}.csv" for n in range(4)]


@dataclass
class Job:
    data: Path
    env: dict[str, str]

    def start(self, *args: str, **env: str) -> subprocess.Popen[bytes]:
        return subprocess.Popen(
            [sys.executable, "-m", "crawlq", *args],
            cwd=ROOT,
            env={**self.env, **env},
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )

    def run(self, *args: str, **env: str) -> tuple[int, str]:
        proc = self.start(*args, **env)
        out = finish(proc)
        return proc.returncode, out

    def ok(self, *args: str, **env: str) -> str:
        code, out = self.run(*args, **env)
        assert code == 0, out
        return out

    def killed_when_held(self, *args: str, hold: str, **env: str) -> None:
        """Runs `crawlq ARGS` until it holds at `hold` (see the app), then SIGKILLs it."""
        held = self.data / "held"
        held.unlink(missing_ok=True)
        proc = self.start(*args, PIPE_HOLD=hold, **env)
        try:
            wait_for(lambda: held.exists() or proc.poll() is not None, what=f"{hold} held")
            assert proc.poll() is None, finish(proc)
            assert held.read_text() == str(proc.pid)
        finally:
            proc.send_signal(signal.SIGKILL)
            proc.communicate()
        held.unlink()

    def rows(self, type_: str) -> list[dict[str, Any]]:
        with ResultsStore(self.data / "results.sqlite") as results:
            return list(results.rows(type_))


@pytest.fixture
def job(tmp_path: Path) -> Job:
    """The pipeline run once over URLS with parse's version 1."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CRAWLQ_", "PIPE_"))}
    env |= {
        "PYTHONPATH": str(ROOT),
        "CRAWLQ_BACKEND": f"sqlite:///{tmp_path / 'queue.db'}",
        "PIPE_DATA": str(tmp_path / "data"),
    }
    made = Job(data=tmp_path / "data", env=env)
    made.ok("schedule", "--app", APP, "--text", "download", *URLS)
    made.ok("worker", APP, "--burst")
    assert [r["versions"] for r in made.rows("total")] == [["1"]] * len(URLS)
    return made


def expect_version(job: Job, version: str) -> None:
    """Every page's lines and total from parse's `version`, and nothing else."""
    lines = job.rows("line")
    assert [r["key"] for r in lines] == [f"{u}#{n}" for u in URLS for n in range(3)]
    assert {r["version"] for r in lines} == {version}
    totals = job.rows("total")
    assert [(r["key"], r["lines"], r["versions"]) for r in totals] == [
        (u, 3, [version]) for u in URLS
    ]


def test_a_reprocess_killed_midway_runs_again_at_once(job: Job) -> None:
    """Killed while parsing the third page, a reprocess was refused when run again: the
    killed process still counted as a worker serving parse, until its heartbeat aged out
    of the queue (two minutes), so a nightly job's retry failed."""
    job.killed_when_held("reprocess", APP, "parse", hold=f"parse:{URLS[2]}", PIPE_VERSION="2")
    out = job.ok("reprocess", APP, "parse", PIPE_VERSION="2")
    assert f"scheduled {len(URLS)} inputs of parse" in out, out
    expect_version(job, "2")


def test_a_page_is_an_input_of_parse_only_once_its_response_is_stored(job: Job) -> None:
    """The fetch stage wrote its page's reference (what `reprocess parse` reads) as soon as
    the page was fetched, its response indexed in the WARC store only with the batch: a
    fetch worker killed in between (or a reprocess looking meanwhile) left an input of parse
    without a stored response, and every reprocess of parse failed on it for good."""
    new = "http://shop.test/new.csv"
    job.ok("schedule", "--app", APP, "--text", "download", new)
    with contextlib.closing(sqlite3.connect(job.data / "warc" / "index.sqlite")) as index:
        index.execute("BEGIN IMMEDIATE")  # the responses stay unindexed until it ends
        job.killed_when_held("worker", APP, "--queue", "download", hold="sync")
    out = job.ok("reprocess", APP, "parse")  # over the pages stored: not the new one
    assert f"scheduled {len(URLS)} inputs of parse; " in out and "(0 dead)" in out, out
    expect_version(job, "1")
    job.ok("worker", APP, "--burst")  # the download again, once its lease ran out
    assert [r["key"] for r in job.rows("total")] == sorted([*URLS, new])


def test_a_page_that_now_redirects_leaves_no_records_of_its_old_url(job: Job) -> None:
    """A stage's output for one input is replaced as a whole, the fetch stage's too: its
    output for a URL is the page it ended on. A URL that redirected where it used to answer
    (http moving to https) kept its old reference and every record made from it beside the
    new page's, and a reprocess parsed its redirect (the latest response stored for it)."""
    old, new = URLS[0], URLS[0].replace("http:", "https:")
    job.ok("schedule", "--app", APP, "--text", "--revisit", "download", old)
    job.ok("worker", APP, "--burst", PIPE_MOVED=f"{old} {new}")
    pages = sorted([new, *URLS[1:]])
    assert [r["key"] for r in job.rows("total")] == pages
    assert [r["key"] for r in job.rows("line")] == [f"{u}#{n}" for u in pages for n in range(3)]
    out = job.ok("reprocess", APP, "parse", PIPE_VERSION="2")
    assert f"scheduled {len(URLS)} inputs of parse; " in out and "(0 dead)" in out, out
    assert [(r["key"], r["lines"], r["versions"]) for r in job.rows("total")] == [
        (u, 3, ["2"]) for u in pages
    ]


def test_an_export_killed_midway_leaves_the_last_one_whole(job: Job, tmp_path: Path) -> None:
    """Killed after writing its first record, an export left a file holding only that
    record where the last whole export was (a consumer reads one page of a nightly four).
    The next export removes what the killed one left."""
    for suffix in ("jsonl", "csv", "parquet"):
        out = tmp_path / f"lines.{suffix}"
        job.ok("export", APP, "line", str(out))
        before = out.read_bytes()
        job.killed_when_held("export", APP, "line", str(out), hold="export")
        assert out.read_bytes() == before, suffix
        job.ok("export", APP, "line", str(out))
        assert out.read_bytes() == before, suffix
        assert [p.name for p in tmp_path.glob(f"*lines.{suffix}*")] == [out.name]
    first = json.loads((tmp_path / "lines.jsonl").read_text().splitlines()[0])
    assert first == {"key": f"{URLS[0]}#0", "text": f"{URLS[0]} line 0", "version": "1"}
