"""Fixes to the results store: key ownership, record values, names, indexes, snapshots."""

from __future__ import annotations

import json
import sqlite3
from decimal import Decimal
from pathlib import Path

import pytest

from crawlq.errors import ConfigError, Permanent
from crawlq.results import export
from crawlq.results.store import ROWS_PAGE, InvalidRecord, KeyConflict, Record, ResultsStore


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


@pytest.mark.parametrize(
    ("value", "says"),
    [
        ({1, 2}, "set"),
        (Decimal("1.5"), "Decimal"),
        (b"\xff", "bytes"),
        (2**63, "64-bit"),
        (-(2**63) - 1, "64-bit"),
        (float("nan"), "nan"),
        (float("inf"), "inf"),
        ([float("nan")], "not JSON"),
        ({"a": float("-inf")}, "not JSON"),
        ({"a": {1, 2}}, "not JSON"),
        ([b"x"], "not JSON"),
    ],
)
def test_bad_values_are_refused_when_the_record_is_built(value: object, says: str) -> None:
    with pytest.raises(InvalidRecord, match=f"record 'line' key 'k': field 'price': .*{says}"):
        line("k", units=1, price=value)


def test_text_utf8_cannot_hold_is_refused_when_the_record_is_built(tmp_path: Path) -> None:
    """A lone surrogate (scraped JSON cut inside a pair, "caf\\ud83d") failed in SQLite when
    the stage wrote it (UnicodeEncodeError: retried, naming no record), or, inside a list or
    dict, was stored, and from then on every export of the type failed on it."""
    cut = json.loads('"caf\\ud83d"')
    for value in (cut, [cut], {"name": cut}, {cut: 1}):
        with pytest.raises(InvalidRecord, match=r"field 'price': .*lone surrogate '\\ud83d'"):
            line("k", price=value)
    with pytest.raises(InvalidRecord, match=r"record 'line': key 'caf\\ud83d': .*lone surrogate"):
        line(cut)
    store = ResultsStore(tmp_path / "r.sqlite")
    store.replace("parse", "r", [line("café 😀", price=["café 😀"], name="ü")])
    assert export(store, "line", tmp_path / "line.jsonl") == 1
    written = json.loads((tmp_path / "line.jsonl").read_text(encoding="utf-8"))
    assert written == {"key": "café 😀", "price": ["café 😀"], "name": "ü"}
    store.close()


def test_invalid_record_is_a_config_error_and_permanent() -> None:
    with pytest.raises(ConfigError) as caught:
        line("k", price=float("nan"))
    assert isinstance(caught.value, Permanent)
    with pytest.raises(Permanent):
        Record(type="bad-name", key="k")
    with pytest.raises(InvalidRecord, match="key must be a string"):
        Record(type="line", key=123)  # type: ignore[arg-type]


def test_good_values_round_trip(tmp_path: Path) -> None:
    store = ResultsStore(tmp_path / "r.sqlite")
    big = 2**63 - 1
    record = line("k", n=big, m=-(2**63), f=1.5, t=True, s="x", nested={"big": 2**70}, tup=(1, 2))
    store.replace("parse", "u", [record])
    (row,) = store.rows("line")
    assert row["n"] == big and row["m"] == -(2**63) and row["f"] == 1.5
    assert row["t"] is True and row["s"] == "x"
    assert row["nested"] == {"big": 2**70}
    assert row["tup"] == [1, 2]  # a tuple is a JSON list
    store.close()


@pytest.mark.parametrize("name", ["line\n", "sqlite_stat1", "SQLITE_x"])
def test_bad_names_are_refused(name: str) -> None:
    with pytest.raises(InvalidRecord):
        Record(type=name, key="k")
    with pytest.raises(InvalidRecord):
        Record(type="line", key="k", data={name: 1})


def test_key_in_another_case_is_a_reserved_field() -> None:
    with pytest.raises(InvalidRecord, match="reserved"):
        Record(type="line", key="k", data={"Key": 1})


def test_a_type_named_like_another_types_index(tmp_path: Path) -> None:
    store = ResultsStore(tmp_path / "r.sqlite")
    store.replace("parse", "u", [Record(type="a", key="1")])
    store.replace("parse", "v", [Record(type="a_by_ref", key="1", data={"n": 2})])
    assert list(store.rows("a_by_ref")) == [{"key": "1", "n": 2}]
    store.close()


def test_a_store_with_old_index_names_is_migrated_on_open(tmp_path: Path) -> None:
    path = tmp_path / "r.sqlite"
    store = ResultsStore(path)
    store.replace("parse", "u", [line("1", n=1)])
    store.close()
    with sqlite3.connect(path) as db:  # as crawlq before this named it
        for (name,) in db.execute(
            "SELECT name FROM sqlite_master WHERE tbl_name = 'line'"
        ).fetchall():
            if name.startswith("_line_"):
                db.execute(f'DROP INDEX "{name}"')
        db.execute('CREATE INDEX "line_by_ref" ON "line" (_stage, _ref)')
    db.close()
    store = ResultsStore(path)
    assert store.count("line") == 1  # only opened, nothing written
    store.close()
    with sqlite3.connect(path) as db:
        names = {r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type = 'index'")}
    db.close()
    assert "line_by_ref" not in names and "_line_by_output" in names
    store = ResultsStore(path)
    store.replace("parse", "v", [Record(type="line_by_ref", key="1")])
    assert store.records("parse", "u") == [line("1", n=1)]
    store.close()


def test_types_differing_only_by_case_are_refused(tmp_path: Path) -> None:
    store = ResultsStore(tmp_path / "r.sqlite")
    store.replace("parse", "u", [line("1", n=1)])
    with pytest.raises(InvalidRecord, match=r"'Line'.*'line'"):
        store.replace("parse", "v", [Record(type="Line", key="2", data={"n": 2})])
    with pytest.raises(InvalidRecord, match=r"'Item'.*'item'"):
        store.replace("parse", "w", [Record(type="Item", key="1"), Record(type="item", key="2")])
    assert store.types() == ["line"]
    assert list(store.rows("line")) == [{"key": "1", "n": 1}]
    store.replace("parse", "w", [Record(type="item", key="2")])  # nothing left behind
    assert store.types() == ["item", "line"]
    store.close()


def test_fields_differing_only_by_case_are_refused(tmp_path: Path) -> None:
    with pytest.raises(InvalidRecord, match="'Price' and 'price'"):
        line("1", Price=1, price=2)
    store = ResultsStore(tmp_path / "r.sqlite")
    store.replace("parse", "u", [line("1", Price=4)])
    with pytest.raises(InvalidRecord, match=r"field 'price'.*'Price'"):
        store.replace("parse", "v", [line("2", price=2)])
    assert list(store.rows("line")) == [{"key": "1", "Price": 4}]
    with pytest.raises(InvalidRecord, match="fields 'Size' and 'size'"):
        store.replace("parse", "v", [line("2", Size=1), line("3", size=2)])
    store.replace("parse", "v", [line("2", size=1)])  # nothing left behind
    # another store object (another process) that has not seen Price yet
    other = ResultsStore(tmp_path / "r.sqlite")
    other.replace("parse", "w", [line("3", n=1)])
    store.replace("parse", "x", [line("4", Price=5, extra=1)])
    with pytest.raises(InvalidRecord, match="field 'EXTRA'"):
        other.replace("parse", "y", [line("5", EXTRA=2)])
    store.close()
    other.close()


def test_paged_reads_need_no_sort(tmp_path: Path) -> None:
    store = ResultsStore(tmp_path / "r.sqlite")
    for ref in ("a", "b"):
        store.replace("parse", ref, [line(f"{ref}{i:04d}", n=i) for i in range(ROWS_PAGE + 5)])
    db = store._db()
    run: list[str] = []
    db.set_trace_callback(run.append)
    try:
        assert len(list(store.rows("line", stage="parse"))) == 2 * (ROWS_PAGE + 5)
        assert len(list(store.rows("line", stage="parse", ref="b"))) == ROWS_PAGE + 5
        assert len(store.records("parse", "a")) == ROWS_PAGE + 5
        store.replace("parse", "a", [line("a0000", n=1)])
    finally:
        db.set_trace_callback(None)
    paged = [sql for sql in run if sql.startswith(("SELECT * FROM", "DELETE FROM"))]
    assert len(paged) > 4
    for sql in paged:
        # the values inlined by the trace: EXPLAIN the statement as run
        plan = [row[3] for row in db.execute("EXPLAIN QUERY PLAN " + sql)]
        assert not any("TEMP B-TREE" in step or step.startswith("SCAN") for step in plan), (
            sql,
            plan,
        )
    store.close()


def test_records_reads_one_snapshot(tmp_path: Path) -> None:
    path = tmp_path / "r.sqlite"

    def run(n: int) -> list[Record]:
        return [
            Record(type=type_, key=f"{type_}{i}", data={"run": n})
            for type_ in ("a", "b")
            for i in range(3)
        ]

    reader, writer = ResultsStore(path), ResultsStore(path)
    writer.replace("parse", "R", run(1))
    db = reader._db()
    rerun: list[str] = []

    def rerun_when_b_is_read(sql: str) -> None:
        # another process re-runs parse over R between the reader's reads of a and of b
        if 'FROM "b"' in sql and not rerun:
            rerun.append(sql)
            writer.replace("parse", "R", run(2))

    db.set_trace_callback(rerun_when_b_is_read)
    try:
        got = reader.records("parse", "R")
    finally:
        db.set_trace_callback(None)
    assert rerun
    assert {r.data["run"] for r in got} == {1}, got  # all of one run, not half of each
    assert not db.in_transaction
    assert {r.data["run"] for r in reader.records("parse", "R")} == {2}
    reader.close()
    writer.close()


def test_values_stored_before_the_checks_still_read(tmp_path: Path) -> None:
    path = tmp_path / "r.sqlite"
    store = ResultsStore(path)
    store.replace("parse", "u", [line("1", n=1)])
    with sqlite3.connect(path) as db:  # as an older crawlq let them through
        db.execute("UPDATE line SET n = ?", (float("inf"),))
    db.close()
    assert [(r.key, r.data) for r in store.records("parse", "u")] == [("1", {"n": float("inf")})]
    store.close()
