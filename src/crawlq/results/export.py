"""Exports a record type of the results store: JSON lines, CSV or Parquet, ordered by key.

Records are read and written a page at a time, so an export of any size takes little memory.
CSV cells that a spreadsheet would run as a formula (text starting with = + - @, a tab or a
carriage return) are written with a leading single quote, as spreadsheets expect text to be
marked; `escape_formulas=False` writes them as they are.
"""

from __future__ import annotations

import csv
import json
from collections.abc import Iterator
from itertools import islice
from pathlib import Path
from typing import Any

from ..errors import ConfigError
from .store import ResultsStore

FORMATS = ("jsonl", "csv", "parquet")
_BATCH = 10_000
#: What starts a formula in Excel, LibreOffice or Google Sheets (OWASP's CSV injection list).
FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")


def export(
    store: ResultsStore,
    type_: str,
    path: Path | str,
    *,
    format: str | None = None,
    escape_formulas: bool = True,
) -> int:
    """Writes every record of `type_` to `path` (format from its suffix unless given);
    returns how many were written. A path that cannot be written is a ConfigError naming
    it; in CSV, text that would start a formula gets a leading ' unless `escape_formulas`
    is false."""
    path = Path(path)
    chosen = (format or path.suffix.lstrip(".")).lower()
    if chosen not in FORMATS:
        raise ConfigError(f"export format {chosen!r}: choose one of {', '.join(FORMATS)}")
    if type_ not in store.types():
        known = ", ".join(store.types()) or "none yet"
        raise ConfigError(f"no record type {type_!r} in {store.path} (types: {known})")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        rows = store.rows(type_)
        if chosen == "jsonl":
            return _jsonl(rows, path)
        if chosen == "csv":
            return _csv(rows, store.columns(type_), path, escape_formulas)
        return _parquet(rows, store.columns(type_), path)
    except OSError as exc:
        reason = exc.strerror or str(exc)
        if isinstance(exc, FileExistsError):  # from mkdir: a file where a folder must be
            reason = "a file, not a folder"
        if exc.filename and str(exc.filename) != str(path):
            reason = f"{exc.filename}: {reason}"
        raise ConfigError(f"cannot write {path}: {reason}") from None


def _jsonl(rows: Iterator[dict[str, Any]], path: Path) -> int:
    count = 0
    with path.open("w", encoding="utf-8") as out:
        for row in rows:
            out.write(json.dumps(row, ensure_ascii=False, sort_keys=False) + "\n")
            count += 1
    return count


def csv_cell(value: Any) -> Any:
    """`value` as a CSV cell that no spreadsheet runs: text starting a formula quoted."""
    if isinstance(value, str) and value.startswith(FORMULA_STARTS):
        return "'" + value
    return value


def _csv(rows: Iterator[dict[str, Any]], columns: list[str], path: Path, escape: bool) -> int:
    count = 0
    with path.open("w", encoding="utf-8", newline="") as out:
        # fields another process adds while this runs are left out, as they are of the header
        writer = csv.DictWriter(out, fieldnames=columns, extrasaction="ignore")
        writer.writeheader()
        for row in rows:
            writer.writerow({k: csv_cell(v) for k, v in row.items()} if escape else row)
            count += 1
    return count


def _parquet(rows: Iterator[dict[str, Any]], columns: list[str], path: Path) -> int:
    import pyarrow as pa
    import pyarrow.parquet as pq

    count = 0
    writer: Any = None
    try:
        while batch := list(islice(rows, _BATCH)):
            table = pa.Table.from_pylist(batch)
            if writer is None:
                writer = pq.ParquetWriter(str(path), _widened(table.schema, columns))
            writer.write_table(table.cast(writer.schema))
            count += len(batch)
        if writer is None:  # no rows: an empty file with the columns, as text
            schema = pa.schema([(c, pa.string()) for c in columns])
            pq.write_table(schema.empty_table(), str(path))
    finally:
        if writer is not None:
            writer.close()
    return count


def _widened(schema: Any, columns: list[str]) -> Any:
    """The first batch's schema with every column present; columns that held only nulls
    there become text."""
    import pyarrow as pa

    fields = []
    for name in columns:
        index = schema.get_field_index(name)
        kind = schema.field(index).type if index >= 0 else pa.string()
        if pa.types.is_null(kind):
            kind = pa.string()
        fields.append(pa.field(name, kind))
    return pa.schema(fields)
