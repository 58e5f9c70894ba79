"""crawlq's commands collect garbage less often than CPython's defaults (worker/collector.py):
checked in real processes, so this test process keeps its own collector settings."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

from crawlq.worker.collector import THRESHOLDS

ROOT = Path(__file__).resolve().parent.parent


def _thresholds_after(setup: str) -> list[int]:
    code = textwrap.dedent(
        f"""
        import gc, json
        {setup}
        from crawlq.worker import collect_less_often
        collect_less_often()
        print(json.dumps(gc.get_threshold()))
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT
    )
    result: list[int] = json.loads(done.stdout)
    return result


def test_raises_the_defaults() -> None:
    assert _thresholds_after("") == list(THRESHOLDS)


def test_keeps_a_higher_threshold_a_program_set() -> None:
    assert _thresholds_after("gc.set_threshold(10**6, 5, 5)") == [10**6, 20, 10]


def test_keeps_a_collector_turned_off() -> None:
    assert _thresholds_after("gc.set_threshold(0)")[0] == 0


def test_a_worker_process_runs_its_tasks_with_them(tmp_path: Path) -> None:
    (tmp_path / "gc_app.py").write_text(
        textwrap.dedent(
            """
            import gc, json, os
            import crawlq

            app = crawlq.App(os.environ["CRAWLQ_BACKEND"])

            @app.task()
            def note(ctx, element):
                with open(os.environ["GC_NOTE"], "a") as out:
                    out.write(json.dumps(gc.get_threshold()) + "\\n")
            """
        )
    )
    note = tmp_path / "note.jsonl"
    env = {
        **os.environ,
        "CRAWLQ_BACKEND": f"sqlite:///{tmp_path / 'queue.db'}",
        "GC_NOTE": str(note),
        "PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT)]),
    }
    crawlq_command = [sys.executable, "-m", "crawlq"]
    subprocess.run(
        [*crawlq_command, "schedule", "note", "1", "--app", "gc_app:app"],
        env=env,
        check=True,
        cwd=tmp_path,
    )
    subprocess.run(
        [*crawlq_command, "worker", "gc_app:app", "--burst", "--processes", "2"],
        env=env,
        check=True,
        cwd=tmp_path,
        timeout=120,
    )
    assert [json.loads(line) for line in note.read_text().splitlines()] == [list(THRESHOLDS)]
