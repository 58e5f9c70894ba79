"""Fixes to the results store: key ownership, record values, names, indexes, snapshots."""

from __future__ import annotations

from pathlib import Path

import pytest

from crawlq.errors import Permanent
from crawlq.results.store import KeyConflict, Record, ResultsStore


def line(key: str, **data: object) -> Record:
    return Record(type="line", key=key, data=dict(data))  # type: ignore[arg-type]


def test_key_written_by_another_input_is_refused(tmp_path: Path) -> None:
    store = ResultsStore(tmp_path / "r.sqlite")
    store.replace("parse", "http://a/r.csv", [line("2026-11#0", units=5)])
    with pytest.raises(KeyConflict) as caught:
        store.replace("parse", "http://b/r.csv", [line("x", units=1), line("2026-11#0", units=9)])
    assert isinstance(caught.value, Permanent)
    message = str(caught.value)
    assert "'2026-11#0'" in message and "http://a/r.csv" in message and "http://b/r.csv" in message
    # nothing of b's output was written, a's is intact
    assert store.records("parse", "http://a/r.csv") == [line("2026-11#0", units=5)]
    assert store.records("parse", "http://b/r.csv") == []
    assert store.refs("parse") == ["http://a/r.csv"]
    # a re-run of a is still fine
    store.replace("parse", "http://a/r.csv", [line("2026-11#0", units=6)])
    assert store.records("parse", "http://a/r.csv") == [line("2026-11#0", units=6)]
    store.close()


def test_key_written_by_another_stage_is_refused(tmp_path: Path) -> None:
    store = ResultsStore(tmp_path / "r.sqlite")
    store.replace("parse", "u", [line("k", units=1)])
    with pytest.raises(KeyConflict, match="stage 'parse'"):
        store.replace("enrich", "u", [line("k", units=2)])
    assert store.records("parse", "u") == [line("k", units=1)]
    store.close()


def test_duplicate_key_in_one_output_is_refused(tmp_path: Path) -> None:
    store = ResultsStore(tmp_path / "r.sqlite")
    with pytest.raises(Permanent, match="two 'line' records with key 'k'"):
        store.replace("parse", "u", [line("k", v=1), line("k", v=2)])
    assert store.records("parse", "u") == []
    assert store.refs("parse") == []
    # one key in two types is fine
    store.replace("parse", "u", [line("k", v=1), Record(type="other", key="k")])
    assert len(store.records("parse", "u")) == 2
    store.close()
