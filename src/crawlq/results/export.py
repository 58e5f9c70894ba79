"""Exports a record type of the results store: JSON lines, CSV or Parquet, ordered by key.

Records are read and written a page at a time, so an export of any size takes little memory.
The file is written beside its path, then put in its place whole: an export killed or failed
midway leaves the previous one there, as it was.
JSON lines hold each record as written: lists, dicts and booleans as JSON has them. In CSV,
lists and dicts are cells of JSON text, booleans true and false. CSV cells that a spreadsheet
would run as a formula (text starting with = + - @, a tab or a carriage return) are written
with a leading single quote, as spreadsheets expect text to be marked; `escape_formulas=False`
writes them as they are. In Parquet, a field of booleans is a boolean column, lists and dicts
are JSON text, and a field that holds text in some records and numbers (or booleans) in
others is a text column (the numbers written as JSON writes them); a field of integers and
decimals is a float column.
"""

from __future__ import annotations

import contextlib
import csv
import glob
import json
import os
import secrets
from collections.abc import Callable, Iterator
from itertools import islice
from pathlib import Path
from typing import Any

from ..errors import ConfigError
from ..liveness import pid_exists
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
    final, part = _part(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        rows = store.rows(type_)
        target = part or path
        if chosen == "jsonl":
            count = _jsonl(rows, target)
        elif chosen == "csv":
            count = _csv(rows, store.columns(type_), target, escape_formulas)
        else:
            count = _parquet(rows, store.column_kinds(type_), target)
        if part is not None:
            with part.open("rb") as written:  # on disk before it takes the last one's place
                os.fsync(written.fileno())
            os.replace(part, final)
        return count
    except OSError as exc:
        reason = exc.strerror or str(exc)
        if isinstance(exc, FileExistsError):  # from mkdir: a file where a folder must be
            reason = "a file, not a folder"
        if exc.filename and str(exc.filename) not in (str(path), str(part)):
            reason = f"{exc.filename}: {reason}"
        raise ConfigError(f"cannot write {path}: {reason}") from None
    finally:
        if part is not None:
            with contextlib.suppress(OSError):  # gone once it took its place
                part.unlink()


def _part(path: Path) -> tuple[Path, Path | None]:
    """The file an export to `path` replaces (`path`, or its target if it is a symlink), and
    where the export is written before it takes that file's place whole, so that a killed
    or failed export leaves the last one as it was: a hidden file beside it, named with this
    process's id (those of processes gone are removed). No such file for a path that is
    neither a file nor nothing yet (/dev/stdout, a pipe): it is written in place."""
    if path.exists() and not path.is_file():
        return path, None
    final = Path(os.path.realpath(path)) if path.is_symlink() else path
    with contextlib.suppress(OSError):  # what exports killed here left
        for old in final.parent.glob(f".{glob.escape(final.name)}.*-*.part"):
            pid = old.name[len(final.name) + 2 :].split("-", 1)[0]
            if pid.isdigit() and not pid_exists(int(pid)):
                old.unlink()
    return final, final.with_name(f".{final.name}.{os.getpid()}-{secrets.token_hex(4)}.part")


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


def _json_text(value: Any) -> Any:
    """Lists, dicts and booleans as JSON text (a CSV writer would write Python's repr)."""
    if isinstance(value, bool | list | dict):
        return json.dumps(value, ensure_ascii=False)
    return value


def _csv(rows: Iterator[dict[str, Any]], columns: list[str], path: Path, escape: bool) -> int:
    count = 0
    with path.open("w", encoding="utf-8", newline="") as out:
        # fields another process adds while this runs are left out, as they are of the header
        writer = csv.DictWriter(out, fieldnames=columns, extrasaction="ignore")
        writer.writeheader()

        def cell(value: Any) -> Any:
            return csv_cell(_json_text(value)) if escape else _json_text(value)

        for row in rows:
            writer.writerow({k: cell(v) for k, v in row.items()})
            count += 1
    return count


def _parquet(rows: Iterator[dict[str, Any]], kinds: dict[str, set[str]], path: Path) -> int:
    import pyarrow as pa
    import pyarrow.parquet as pq

    types = {name: _arrow_type(held) for name, held in kinds.items()}
    schema = pa.schema(list(types.items()))
    as_text = [n for n, kind in types.items() if kind == pa.string() and kinds[n] - {"text"}]
    count = 0
    with pq.ParquetWriter(str(path), schema) as writer:
        while batch := list(islice(rows, _BATCH)):
            for row in batch:
                for name in as_text:
                    row[name] = _text(row.get(name))
            try:
                table = pa.Table.from_pylist(batch, schema=schema)
            except (pa.ArrowInvalid, pa.ArrowTypeError) as exc:  # a record written meanwhile
                raise ConfigError(
                    f"cannot export to {path}: a field changed type while exporting ({exc});"
                    " export again"
                ) from None
            writer.write_table(table)
            count += len(batch)
    return count


def _arrow_type(held: set[str]) -> Any:
    """The column for a field holding these kinds (see ResultsStore.column_kinds): integers,
    floats (integers and decimals), booleans, bytes, or text (text only, lists and dicts,
    nothing but nulls, or a mix)."""
    import pyarrow as pa

    kinds: dict[frozenset[str], Callable[[], Any]] = {
        frozenset({"integer"}): pa.int64,
        frozenset({"real"}): pa.float64,
        frozenset({"integer", "real"}): pa.float64,
        frozenset({"bool"}): pa.bool_,
        frozenset({"blob"}): pa.binary,
    }
    return kinds.get(frozenset(held), pa.string)()


def _text(value: Any) -> str | None:
    """A value of a text column that is not text (a mixed field, a list or dict) as JSON
    writes it."""
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return json.dumps(value, ensure_ascii=False)
