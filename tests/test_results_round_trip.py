"""A stage's records read back exactly as written: lists and dicts stay lists and dicts,
booleans booleans, None None, through `records`, `rows`, the next stage and exports; and
a store written before the store kept what each value was still reads as it did. Real
SQLite files."""

from __future__ import annotations

import csv
import json
import sqlite3
from collections.abc import Iterator
from pathlib import Path

import pyarrow.parquet as pq
import pytest

import crawlq
from crawlq.pipeline import Pipeline, StoredResponse
from crawlq.results import InvalidRecord, Record, ResultsStore, export
from crawlq.types import JSON

WRITTEN: dict[str, JSON] = {
    "tags": ["a", "b"],
    "price": {"eur": 1.5, "offers": [{"n": 2, "sale": False}]},
    "empty_list": [],
    "empty_dict": {},
    "in_stock": True,
    "discontinued": False,
    "note": None,
    "units": 3,
    "big": 2**63 - 1,
    "weight": 2.0,
    "name": "widget",
    "looks_like_json": "[1, 2]",
    "looks_like_true": "true",
}


def exactly(data: object) -> str:
    """`data` as JSON text, where True is not 1, 2.0 is not 2 and a missing field is not
    None (`==` on the values themselves would take them as equal)."""
    return json.dumps(data, sort_keys=True)


def item(key: str, **data: JSON) -> Record:
    return Record(type="item", key=key, data=data)


@pytest.fixture
def store(tmp_path: Path) -> Iterator[ResultsStore]:
    with ResultsStore(tmp_path / "results.sqlite") as opened:
        yield opened


def test_records_read_back_exactly_what_was_written(store: ResultsStore) -> None:
    store.replace("parse", "u", [item("a", **WRITTEN), item("b", units=1)])
    got = store.records("parse", "u")
    assert [r.key for r in got] == ["a", "b"]
    assert exactly(got[0].data) == exactly(WRITTEN)
    assert exactly(got[1].data) == exactly({"units": 1})  # not the other record's fields


def test_a_store_reopened_reads_the_same(tmp_path: Path) -> None:
    with ResultsStore(tmp_path / "r.sqlite") as store:
        store.replace("parse", "u", [item("a", **WRITTEN)])
    with ResultsStore(tmp_path / "r.sqlite") as store:
        (got,) = store.records("parse", "u")
    assert exactly(got.data) == exactly(WRITTEN)


def test_rows_give_the_written_values_and_none_for_fields_a_record_lacks(
    store: ResultsStore,
) -> None:
    store.replace("parse", "u", [item("a", **WRITTEN)])
    store.replace("parse", "v", [item("b", tags="one", in_stock=1)])
    first, second = store.rows("item", stage="parse")
    assert exactly(first) == exactly({"key": "a", **WRITTEN})
    assert exactly(second) == exactly(
        {"key": "b", **dict.fromkeys(WRITTEN), "tags": "one", "in_stock": 1}
    )
    assert exactly(list(store.rows("item", stage="parse", ref="u"))) == exactly([first])


def test_a_field_may_change_kind_between_records_and_runs(store: ResultsStore) -> None:
    store.replace("parse", "u", [item("a", v=[1]), item("b", v=True), item("c", v=1)])
    assert exactly([r.data for r in store.records("parse", "u")]) == exactly(
        [{"v": [1]}, {"v": True}, {"v": 1}]
    )
    store.replace("parse", "u", [item("a", v="[1]"), item("b", v=1), item("c", v={"x": None})])
    assert exactly([r.data for r in store.records("parse", "u")]) == exactly(
        [{"v": "[1]"}, {"v": 1}, {"v": {"x": None}}]
    )


@pytest.mark.parametrize("value", [{1: "a"}, [{"a": {None: 1}}], ({"b": 2, 3: "c"},)])
def test_dicts_with_keys_json_would_turn_into_text_are_refused(value: JSON) -> None:
    with pytest.raises(InvalidRecord, match=r"field 'd': not JSON: dict key .* is not a string"):
        item("a", d=value)


def test_dict_fields_keep_their_order(store: ResultsStore) -> None:
    store.replace("parse", "u", [item("a", d={"z": 1, "a": 2, "m": {"y": 1, "b": 2}})])
    (got,) = store.records("parse", "u")
    assert json.dumps(got.data["d"]) == '{"z": 1, "a": 2, "m": {"y": 1, "b": 2}}'


@pytest.mark.parametrize("is_async", [False, True], ids=["sync", "async"])
async def test_the_next_stage_receives_what_the_stage_before_wrote(
    tmp_path: Path, is_async: bool
) -> None:
    """download -> seed -> parse -> use: parse writes nested values and booleans, use gets
    them as parse wrote them (run by a worker, as `reprocess` runs them)."""
    app = crawlq.App(f"sqlite:///{tmp_path / 'q.db'}")
    pipeline = Pipeline(app, data=tmp_path / "data")
    received: list[str] = []

    @pipeline.fetch()
    async def download(ctx: crawlq.Context, url: str) -> None:
        return None

    @pipeline.stage()
    def seed(ctx: crawlq.SyncContext, stored: StoredResponse) -> list[Record]:
        return []

    @pipeline.stage()
    def parse(ctx: crawlq.SyncContext, seeds: list[Record]) -> list[Record]:
        (first,) = seeds
        return [item(f"{first.key}#0", **WRITTEN), item(f"{first.key}#1", tags=["x"], ok=False)]

    def use_records(parsed: list[Record]) -> list[Record]:
        received.append(exactly([(r.key, r.data) for r in parsed]))
        return [Record(type="used", key=r.key, data={"tags": r.data["tags"]}) for r in parsed]

    if is_async:

        @pipeline.stage()
        async def use(ctx: crawlq.Context, parsed: list[Record]) -> list[Record]:
            return use_records(parsed)

    else:

        @pipeline.stage()
        def use(ctx: crawlq.SyncContext, parsed: list[Record]) -> list[Record]:
            return use_records(parsed)

    pipeline.results.replace("seed", "r", [Record(type="seed", key="s")])
    try:
        result = await pipeline.reprocess("parse")
    finally:
        await app.aclose()
    assert result.worker is not None and result.worker.dead == 0
    assert received == [exactly([("s#0", WRITTEN), ("s#1", {"tags": ["x"], "ok": False})])]
    assert exactly([r.data for r in pipeline.results.records("use", "r")]) == exactly(
        [{"tags": ["a", "b"]}, {"tags": ["x"]}]
    )
    pipeline.results.close()


# -- exports ----------------------------------------------------------------------------------


def test_jsonl_has_nested_json_and_booleans(store: ResultsStore, tmp_path: Path) -> None:
    store.replace("parse", "u", [item("a", **WRITTEN), item("b", units=1)])
    assert export(store, "item", tmp_path / "i.jsonl") == 2
    lines = (tmp_path / "i.jsonl").read_text(encoding="utf-8").splitlines()
    assert exactly([json.loads(line) for line in lines]) == exactly(
        [{"key": "a", **WRITTEN}, {"key": "b", **dict.fromkeys(WRITTEN), "units": 1}]
    )


def test_csv_writes_nested_values_as_json_text_and_booleans_as_json_does(
    store: ResultsStore, tmp_path: Path
) -> None:
    store.replace("parse", "u", [item("a", **WRITTEN)])
    assert export(store, "item", tmp_path / "i.csv") == 1
    with (tmp_path / "i.csv").open(encoding="utf-8", newline="") as file:
        (row,) = list(csv.DictReader(file))
    assert json.loads(row["tags"]) == ["a", "b"]
    assert json.loads(row["price"]) == WRITTEN["price"]
    assert (row["empty_list"], row["empty_dict"]) == ("[]", "{}")
    assert (row["in_stock"], row["discontinued"], row["note"]) == ("true", "false", "")
    assert (row["units"], row["weight"], row["looks_like_json"]) == ("3", "2.0", "[1, 2]")


def test_parquet_has_boolean_columns_and_nested_values_as_json_text(
    store: ResultsStore, tmp_path: Path
) -> None:
    store.replace("parse", "u", [item("a", tags=["a"], ok=True, flag=True, n=1, d={"k": [1]})])
    store.replace("parse", "v", [item("b", tags=["b", "c"], ok=False, flag=2, n=2)])
    assert export(store, "item", tmp_path / "i.parquet") == 2
    table = pq.read_table(tmp_path / "i.parquet")
    assert {f.name: str(f.type) for f in table.schema} == {
        "key": "string",
        "tags": "string",
        "ok": "bool",
        "flag": "string",  # booleans and numbers: a mixed field, text
        "n": "int64",
        "d": "string",
    }
    assert table.to_pylist() == [
        {"key": "a", "tags": '["a"]', "ok": True, "flag": "true", "n": 1, "d": '{"k": [1]}'},
        {"key": "b", "tags": '["b", "c"]', "ok": False, "flag": "2", "n": 2, "d": None},
    ]


# -- stores written before ----------------------------------------------------------------------

#: A store as crawlq wrote it before it kept what each value was (3484dec, `iterdump`).
OLD_STORE = """
CREATE TABLE _outputs (
    stage TEXT NOT NULL,
    ref TEXT NOT NULL,
    records INTEGER NOT NULL,
    updated REAL NOT NULL,
    PRIMARY KEY (stage, ref)
) WITHOUT ROWID;
INSERT INTO "_outputs" VALUES('parse','u',1,1.79550369235401654239e+09);
CREATE TABLE _types (
    type TEXT NOT NULL,
    stage TEXT NOT NULL,
    PRIMARY KEY (type, stage)
) WITHOUT ROWID;
INSERT INTO "_types" VALUES('item','parse');
CREATE TABLE "item" (key TEXT PRIMARY KEY, _stage TEXT NOT NULL, _ref TEXT NOT NULL,
    _updated REAL NOT NULL, "tags", "ok", "n", "note", "price", "name");
INSERT INTO "item" VALUES('a','parse','u',1.79550369235401654239e+09,'["x","y"]',1,3,NULL,1.5,'A');
CREATE INDEX "_item_by_output" ON "item" (_stage, _ref, key);
CREATE INDEX "_item_by_stage" ON "item" (_stage, key);
"""
#: What it read back: nested values as their JSON text, booleans as integers.
OLD_READ = {"tags": '["x","y"]', "ok": 1, "n": 3, "price": 1.5, "name": "A"}


def old_store(path: Path) -> Path:
    with sqlite3.connect(path) as db:
        db.executescript(OLD_STORE)
    db.close()
    return path


def test_a_store_written_before_reads_as_it_did(tmp_path: Path) -> None:
    with ResultsStore(old_store(tmp_path / "r.sqlite")) as store:
        (got,) = store.records("parse", "u")
        assert exactly(got.data) == exactly(OLD_READ)
        assert exactly(list(store.rows("item"))) == exactly(
            [{"key": "a", **OLD_READ, "note": None}]
        )
        assert store.columns("item") == ["key", "tags", "ok", "n", "note", "price", "name"]
        assert export(store, "item", tmp_path / "i.jsonl") == 1


def test_a_store_written_before_takes_new_records_beside_its_old_ones(tmp_path: Path) -> None:
    path = old_store(tmp_path / "r.sqlite")
    with ResultsStore(path) as store:
        store.replace("parse", "v", [item("b", tags=["p"], ok=True, note=None)])
    with ResultsStore(path) as store:
        assert exactly(store.records("parse", "u")[0].data) == exactly(OLD_READ)
        assert exactly(store.records("parse", "v")[0].data) == exactly(
            {"tags": ["p"], "ok": True, "note": None}
        )
        assert store.columns("item") == ["key", "tags", "ok", "n", "note", "price", "name"]
        assert [r["tags"] for r in store.rows("item")] == ['["x","y"]', ["p"]]
