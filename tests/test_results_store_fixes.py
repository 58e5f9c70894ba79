"""Fixes to the results store: key ownership, record values, names, indexes, snapshots."""

from __future__ import annotations

import json
from decimal import Decimal
from pathlib import Path

import pytest

from crawlq.errors import ConfigError, Permanent
from crawlq.results.store import InvalidRecord, KeyConflict, Record, ResultsStore


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
    assert json.loads(row["nested"]) == {"big": 2**70}
    assert json.loads(row["tup"]) == [1, 2]
    store.close()
