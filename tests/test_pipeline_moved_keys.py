"""A reprocess whose new code emits a key from another input than the old code did: it
died on a KeyConflict whenever the new owner ran before the old one (whose old output still
held the key). Now the outputs a reprocess will write again are stale, and a stale output
gives a key up to the output that emits it. Real SQLite files; the last test runs real
`crawlq` processes, SIGKILLed at a point it chose (see tests/apps/moved_key_app.py)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

import crawlq
from crawlq.pipeline import Pipeline, Record, StoredResponse
from crawlq.results import ResultsStore
from crawlq.results import store as store_module
from crawlq.results.store import KeyConflict

from .test_pipeline_processes import ROOT, Job

PAGES = ["page-1", "page-2"]


def item(key: str, by: str, code: str) -> Record:
    return Record(type="item", key=key, data={"by": by, "code": code})


def test_a_stale_output_gives_up_a_key_in_the_new_owners_transaction(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(store_module, "STALE_CHUNK", 2)  # marked in two transactions
    with ResultsStore(tmp_path / "results.sqlite") as store:
        store.replace("parse", "a", [item("a#0", "a", "old"), item("k", "a", "old")])
        store.replace("parse", "b", [item("b#0", "b", "old")])
        with pytest.raises(KeyConflict):  # not stale: refused, as before
            store.replace("parse", "b", [item("b#0", "b", "new"), item("k", "b", "new")])
        assert store.mark_stale(["parse", "total"], ["a", "b", "c"]) == 2  # outputs there are
        assert store.stale("parse") == ["a", "b"]
        store.replace("parse", "b", [item("b#0", "b", "new"), item("k", "b", "new")])
        assert store.stale("parse") == ["a"]  # written again: no longer stale
        assert [r.key for r in store.records("parse", "a")] == ["a#0"]
        assert [(r["key"], r["by"], r["code"]) for r in store.rows("item")] == [
            ("a#0", "a", "old"),
            ("b#0", "b", "new"),
            ("k", "b", "new"),
        ]
        # a's new code emitting k too: two outputs of new code, a conflict; nothing written
        with pytest.raises(KeyConflict, match="already written by stage 'parse', input 'b'"):
            store.replace("parse", "a", [item("a#0", "a", "new"), item("k", "a", "new")])
        assert [r.data["code"] for r in store.records("parse", "a")] == ["old"]
        store.replace("parse", "a", [item("a#0", "a", "new")])
        assert store.stale("parse") == []
        assert store.done() == {"parse": 2}


def _moving(tmp_path: Path, *, owners: set[str]) -> tuple[Pipeline, list[str]]:
    """download -> source -> parse, where parse's old code emitted key `shared` from
    page-2 (its outputs are stored) and its new code emits it from each page of `owners`."""
    app = crawlq.App(f"sqlite:///{tmp_path / 'q.db'}")
    pipeline = Pipeline(app, data=tmp_path / "data")
    ran: list[str] = []

    @pipeline.fetch()
    async def download(ctx: crawlq.Context, url: str) -> None:
        return None

    @pipeline.stage()
    def source(ctx: crawlq.SyncContext, stored: StoredResponse) -> list[Record]:
        return []

    @pipeline.stage()
    def parse(ctx: crawlq.SyncContext, given: list[Record]) -> list[Record]:
        page = str(ctx.element)
        ran.append(page)
        return [item(f"{page}#0", page, "new")] + (
            [item("shared", page, "new")] if page in owners else []
        )

    for page in PAGES:
        pipeline.results.replace("source", page, [Record(type="src", key=page)])
    pipeline.results.replace("parse", "page-1", [item("page-1#0", "page-1", "old")])
    pipeline.results.replace(
        "parse", "page-2", [item("page-2#0", "page-2", "old"), item("shared", "page-2", "old")]
    )
    return pipeline, ran


@pytest.mark.parametrize("to", PAGES)
async def test_a_reprocess_moves_a_key_to_the_input_the_new_code_emits_it_from(
    tmp_path: Path, to: str
) -> None:
    """To page-1, the new owner runs first (one at a time, in order): it failed on the key
    page-2's old output held. To page-2: the key stays where it was."""
    pipeline, ran = _moving(tmp_path, owners={to})
    try:
        result = await pipeline.reprocess("parse", concurrency=1)
    finally:
        await pipeline.app.aclose()
        pipeline.results.close()
    assert ran == PAGES  # page-1 first
    assert result.worker is not None and result.worker.dead == 0 and result.finished
    assert [(r["key"], r["by"], r["code"]) for r in pipeline.results.rows("item")] == [
        ("page-1#0", "page-1", "new"),
        ("page-2#0", "page-2", "new"),
        ("shared", to, "new"),
    ]
    assert pipeline.results.stale("parse") == []


async def test_a_key_the_new_code_emits_from_two_inputs_is_still_a_conflict(
    tmp_path: Path,
) -> None:
    pipeline, ran = _moving(tmp_path, owners=set(PAGES))
    try:
        result = await pipeline.reprocess("parse", concurrency=1)
        backend = await pipeline.app.backend()
        (dead,) = await backend.dead_letters("parse")
    finally:
        await pipeline.app.aclose()
        pipeline.results.close()
    assert ran == PAGES
    assert result.worker is not None and result.worker.dead == 1 and not result.finished
    # page-1 took it from page-2's stale output; page-2's new code emitting it too is refused
    assert "KeyConflict" in dead.error and "input 'page-1'" in dead.error, dead.error
    assert dead.payload == '"page-2"'
    rows = [(r["key"], r["by"], r["code"]) for r in pipeline.results.rows("item")]
    assert ("shared", "page-1", "new") in rows


async def test_a_key_held_by_an_input_the_reprocess_leaves_alone_is_a_conflict(
    tmp_path: Path,
) -> None:
    """`--where page-1`: page-2's output is not written again, so it keeps its key."""
    pipeline, _ = _moving(tmp_path, owners={"page-1"})
    try:
        result = await pipeline.reprocess("parse", where=["page-1"], concurrency=1)
    finally:
        await pipeline.app.aclose()
        pipeline.results.close()
    assert result.worker is not None and result.worker.dead == 1
    assert ("shared", "page-2", "old") in [
        (r["key"], r["by"], r["code"]) for r in pipeline.results.rows("item")
    ]


APP = "tests.apps.moved_key_app:app"
URLS = [f"http://shop.test/{n}.csv" for n in range(4)]


def test_a_reprocess_killed_after_a_key_moved_converges_when_run_again(tmp_path: Path) -> None:
    """The new code finds line 2 of the last page on the first page. One input at a time,
    the first page takes it (from the last page's old output), then the reprocess is killed
    on the third page; run again, it ends with exactly the new code's rows."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CRAWLQ_", "PIPE_"))}
    env |= {
        "PYTHONPATH": str(ROOT),
        "CRAWLQ_BACKEND": f"sqlite:///{tmp_path / 'queue.db'}",
        "PIPE_DATA": str(tmp_path / "data"),
    }
    job = Job(data=tmp_path / "data", env=env)
    job.ok("schedule", "--app", APP, "--text", "download", *URLS)
    job.ok("worker", APP, "--burst")
    moved = f"{URLS[3]}#2"
    new = {"PIPE_VERSION": "2", "PIPE_MOVE": f"{moved} {URLS[0]}"}
    job.killed_when_held("reprocess", APP, "parse", "-c", "1", hold=f"parse:{URLS[2]}", **new)
    assert {r["key"]: r["page"] for r in job.rows("line")}[moved] == URLS[0]  # taken, then killed
    out = job.ok("reprocess", APP, "parse", **new)
    assert f"scheduled {len(URLS)} inputs of parse" in out and "(0 dead)" in out, out
    lines = job.rows("line")
    assert sorted(r["key"] for r in lines) == sorted(f"{u}#{n}" for u in URLS for n in range(3))
    assert {r["version"] for r in lines} == {"2"}
    assert [(r["key"], r["page"], r["text"]) for r in lines if r["key"] == moved] == [
        (moved, URLS[0], "moved here")
    ]
    assert [(r["key"], r["lines"]) for r in job.rows("total")] == [
        (URLS[0], 4),
        (URLS[1], 3),
        (URLS[2], 3),
        (URLS[3], 2),
    ]
    with ResultsStore(job.data / "results.sqlite") as results:
        assert results.stale("parse") == results.stale("total") == []
