"""The results store: records in SQLite, one table per record type, identified by key.

Each table has the record's `key` (primary key), the stage and the input reference that
produced it (`_stage`, `_ref`), when it was written (`_updated`), one column per field,
added the first time a field appears, and `_kinds`: what of the record's values a column
cannot say by itself (lists and dicts, booleans, None given), so that they read back as
written (see values.py; older stores' tables get it the first time they are written).

A stage's output for one reference is *replaced* in one transaction: the rows it wrote for
that reference last time are deleted, the new ones inserted, and the `_outputs` row (stage,
ref) written. So running a stage twice over the same input leaves exactly the same rows. A
key belongs to the (stage, ref) that wrote it: another one writing the same key fails
(KeyConflict) rather than take it over, unless that output is *stale*: a reprocess marked it
(`mark_stale`) to be written again by the stage's new code and it has not been yet. New code
may emit a key from another input than the old code did; the stale output then gives the
key up (its row goes to the new owner, in the new owner's transaction) instead of failing
it, so a reprocess converges whatever order it runs the inputs in. A key two outputs of the
new code emit still fails the second. `forget` removes a (stage, ref) output and its rows
(the pipeline's, when a fetched URL now redirects: it is no input any more).

Tables of the store itself:

    _outputs   (stage, ref) -> records written, when: what each stage has produced
    _types     (type, stage): which record types each stage writes
    _stale     (stage, ref): outputs a reprocess will write again, until they are written
"""

from __future__ import annotations

import os
import re
import sqlite3
import threading
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import ConfigError, Permanent
from ..types import JSON
from ..writelock import WriteLock, immediate, open_shared
from .values import KINDS, Scalar, encode, row_reader, text_problem, value_problem

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,62}")
_RESERVED = frozenset({"key", "_stage", "_ref", "_updated", KINDS})
#: Records `rows` reads at a time.
ROWS_PAGE = 1_000
#: References `mark_stale` marks a transaction.
STALE_CHUNK = 5_000

_SCHEMA = """
CREATE TABLE IF NOT EXISTS _outputs (
    stage TEXT NOT NULL,
    ref TEXT NOT NULL,
    records INTEGER NOT NULL,
    updated REAL NOT NULL,
    PRIMARY KEY (stage, ref)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS _types (
    type TEXT NOT NULL,
    stage TEXT NOT NULL,
    PRIMARY KEY (type, stage)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS _stale (
    stage TEXT NOT NULL,
    ref TEXT NOT NULL,
    PRIMARY KEY (stage, ref)
) WITHOUT ROWID;
"""


class InvalidRecord(ConfigError, Permanent):
    """A record that cannot be stored as given (a bad name or value, a key given twice in
    one output): a ConfigError, and Permanent, so a stage raising it is not retried."""


class KeyConflict(Permanent):
    """A record whose key another (stage, input) already wrote: keys identify records per
    type across the whole store, so the second writer fails instead of taking it over (unless
    that output is stale: see the module's docstring)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Record:
    """One result: `type` names its table, `key` identifies it there (a later record with
    the same key replaces it), `data` holds its fields (JSON values)."""

    type: str
    key: str
    data: dict[str, JSON] = field(default_factory=dict)

    def __post_init__(self) -> None:
        check_name(self.type, "record type", InvalidRecord)
        if not isinstance(self.key, str):
            raise InvalidRecord(
                f"record {self.type!r}: key must be a string, got {type(self.key).__name__}"
                f" {self.key!r}"
            )
        problem = text_problem(self.key)
        if problem:
            raise InvalidRecord(f"record {self.type!r}: key {self.key!r}: {problem}")
        folded: dict[str, str] = {}
        for name, value in self.data.items():
            check_name(name, f"field of {self.type!r}", InvalidRecord)
            if name.lower() in _RESERVED:
                raise InvalidRecord(f"record {self.type!r}: field name {name!r} is reserved")
            other = folded.setdefault(name.lower(), name)
            if other != name:
                raise InvalidRecord(
                    f"record {self.type!r} key {self.key!r}: fields {other!r} and {name!r}"
                    " differ only by case (SQLite column names ignore case)"
                )
            problem = value_problem(value)
            if problem:
                raise InvalidRecord(
                    f"record {self.type!r} key {self.key!r}: field {name!r}: {problem}"
                )


def check_name(name: str, what: str, error: type[ConfigError] = ConfigError) -> str:
    if not isinstance(name, str) or not _NAME.fullmatch(name) or name.startswith("_"):
        raise error(f"{what} {name!r}: use letters, digits and _ (not first), at most 63")
    if name.lower().startswith("sqlite_"):
        raise error(f"{what} {name!r}: names starting with sqlite_ are SQLite's own")
    return name


def _indexes(type_: str) -> dict[str, str]:
    """The indexes of `type_`'s table, name -> columns. Their names start with _, which no
    record type takes, so they cannot collide with a type's table (stores before this named
    one `{type}_by_ref`, and type `{type}_by_ref` could not then be created)."""
    # (stage, ref) pages ordered by key (records, rows(ref=, stage=), replace's delete), and
    # stage pages ordered by key (rows(stage=)): both without a sort per page
    return {f"_{type_}_by_output": "_stage, _ref, key", f"_{type_}_by_stage": "_stage, key"}


def _old_indexes(type_: str) -> list[str]:
    """Indexes older stores have on `type_`'s table that `_indexes` replaced."""
    return [f"{type_}_by_ref", f"_{type_}_by_ref"]


def _stored(type_: str, key: str, data: dict[str, JSON]) -> Record:
    """A record read back from the store, not checked again: its names were when written,
    and a value stored by an older crawlq that checked less (inf, bytes) still reads."""
    record = object.__new__(Record)
    object.__setattr__(record, "type", type_)
    object.__setattr__(record, "key", key)
    object.__setattr__(record, "data", data)
    return record


class ResultsStore:
    """A SQLite file of results. Thread safe (one connection behind a lock); several
    processes may share the file (WAL; writers take turns, see crawlq.writelock)."""

    def __init__(self, path: Path | str) -> None:
        self.path = Path(path)
        self._lock = threading.RLock()
        self._write_lock = WriteLock(str(self.path))
        self._connection: sqlite3.Connection | None = None
        self._columns: dict[str, list[str]] = {}
        self._statements: dict[tuple[Any, ...], str] = {}

    def __repr__(self) -> str:
        return f"<ResultsStore {self.path}>"

    def _db(self) -> sqlite3.Connection:
        if self._connection is None:
            connection = open_shared(self.path, _SCHEMA, timeout=60)
            try:
                self._migrate(connection)
            except BaseException:
                connection.close()
                raise
            self._connection = connection
        return self._connection

    def sync(self) -> None:
        """Puts every write committed so far on disk (its commits are not synced one by one,
        see writelock.open_shared): fsyncs the write-ahead log, where they are until a
        checkpoint, which syncs what it moves. Or raises OSError: then some may not be."""
        wal = self.path.with_name(self.path.name + "-wal")
        try:
            descriptor = os.open(wal, os.O_RDONLY)
        except FileNotFoundError:
            return  # nothing written since the last checkpoint emptied it
        try:
            os.fsync(descriptor)
        finally:
            os.close(descriptor)

    def close(self) -> None:
        with self._lock:
            if self._connection is not None:
                self._connection.close()
                self._connection = None
            self._write_lock.close()
            self._columns.clear()

    async def aclose(self) -> None:
        self.close()

    def __enter__(self) -> ResultsStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- writing --------------------------------------------------------------------------

    def replace(self, stage: str, ref: str, records: Sequence[Record]) -> None:
        """Makes `records` the whole output of `stage` for input `ref`, atomically.

        Raises InvalidRecord if two of `records` share a type and key, and KeyConflict (and
        writes nothing) if a key is already held by a record another stage or input wrote,
        unless that output is stale (`mark_stale`): its record is then this output's."""
        seen: set[tuple[str, str]] = set()
        cases: dict[tuple[str, ...], str] = {}
        for record in records:
            other = cases.setdefault((record.type.lower(),), record.type)
            if other != record.type:
                raise InvalidRecord(
                    f"stage {stage!r}, input {ref!r}: record types {other!r} and"
                    f" {record.type!r} differ only by case (SQLite ignores case)"
                )
            for name in record.data:
                other = cases.setdefault((record.type, name.lower()), name)
                if other != name:
                    raise InvalidRecord(
                        f"stage {stage!r}, input {ref!r}: {record.type!r} fields {other!r} and"
                        f" {name!r} differ only by case (SQLite ignores case)"
                    )
            if (record.type, record.key) in seen:
                raise InvalidRecord(
                    f"stage {stage!r}, input {ref!r}: two {record.type!r} records with key"
                    f" {record.key!r} in one output"
                )
            seen.add((record.type, record.key))
        with self._lock:
            db = self._db()
            with self._write_lock.held():
                for attempt in range(2):
                    for record in records:
                        self._ensure_table(db, record)
                    try:
                        self._replace(db, stage, ref, records)
                        return
                    except sqlite3.OperationalError as exc:
                        # another process added or dropped a column meanwhile: read it again
                        if attempt or "column" not in str(exc):
                            raise
                        self._columns.clear()

    def _replace(
        self, db: sqlite3.Connection, stage: str, ref: str, records: Sequence[Record]
    ) -> None:
        with immediate(db):
            types = {r.type for r in records}
            self._delete(db, stage, ref, types)
            db.executemany(
                "INSERT OR IGNORE INTO _types (type, stage) VALUES (?, ?)",
                [(t, stage) for t in sorted(types)],
            )
            now = time.time()
            for record in records:
                columns, kinds = encode(record.data)
                values: list[Scalar] = [record.key, stage, ref, now, kinds, *columns]
                if db.execute(self._insert(record), values).rowcount == 0:
                    owner = db.execute(
                        f'SELECT _stage, _ref FROM "{record.type}" WHERE key = ?', (record.key,)
                    ).fetchone()
                    if self._give_up(db, record, owner):
                        db.execute(self._insert(record), values)
                        continue
                    raise KeyConflict(
                        f"{record.type!r} record {record.key!r} from stage {stage!r}, input"
                        f" {ref!r}: that key is already written by stage {owner[0]!r}, input"
                        f" {owner[1]!r} (keys must be unique per record type)"
                    )
            db.execute(
                "INSERT INTO _outputs (stage, ref, records, updated) VALUES (?, ?, ?, ?)"
                " ON CONFLICT (stage, ref) DO UPDATE SET records = excluded.records,"
                " updated = excluded.updated",
                (stage, ref, len(records), now),
            )
            db.execute("DELETE FROM _stale WHERE stage = ? AND ref = ?", (stage, ref))

    @staticmethod
    def _give_up(db: sqlite3.Connection, record: Record, owner: tuple[str, str]) -> bool:
        """Deletes the row holding `record`'s key if its output, `owner` (stage, ref), is
        stale, and says whether it did (inside `_replace`'s transaction)."""
        if not db.execute("SELECT 1 FROM _stale WHERE stage = ? AND ref = ?", owner).fetchone():
            return False
        db.execute(f'DELETE FROM "{record.type}" WHERE key = ?', (record.key,))
        db.execute("UPDATE _outputs SET records = records - 1 WHERE stage = ? AND ref = ?", owner)
        return True

    def mark_stale(self, stages: Sequence[str], refs: Sequence[str]) -> int:
        """Marks the outputs of `stages` for `refs` (those there are) as about to be written
        again by new code, and returns how many: until one is written (or forgotten), a key
        it holds goes to another output that emits it (a key the new code emits from another
        input), instead of failing that one with KeyConflict. Written STALE_CHUNK references
        a transaction, so other writers are not held off for long: mark before scheduling."""
        marked = 0
        for start in range(0, len(refs), STALE_CHUNK):
            chunk = refs[start : start + STALE_CHUNK]
            with self._lock:
                db = self._db()
                with self._write_lock.held(), immediate(db):
                    before = db.total_changes
                    db.executemany(
                        "INSERT OR IGNORE INTO _stale (stage, ref) SELECT ?, ?"
                        " WHERE EXISTS (SELECT 1 FROM _outputs WHERE stage = ? AND ref = ?)",
                        ((stage, ref, stage, ref) for stage in stages for ref in chunk),
                    )
                    marked += db.total_changes - before
        return marked

    def stale(self, stage: str) -> list[str]:
        """The references whose output of `stage` is marked stale (`mark_stale`), in order."""
        with self._lock:
            rows = (
                self._db()
                .execute("SELECT ref FROM _stale WHERE stage = ? ORDER BY ref", (stage,))
                .fetchall()
            )
        return [row[0] for row in rows]

    def forget(self, stage: str, ref: str) -> None:
        """Removes what `stage` wrote for `ref`, its records and its output, as if it had never
        run over `ref` (an input that is no more: a URL that now redirects)."""
        with self._lock:
            db = self._db()
            with self._write_lock.held(), immediate(db):
                self._delete(db, stage, ref, set())
                db.execute("DELETE FROM _outputs WHERE stage = ? AND ref = ?", (stage, ref))
                db.execute("DELETE FROM _stale WHERE stage = ? AND ref = ?", (stage, ref))

    @staticmethod
    def _delete(db: sqlite3.Connection, stage: str, ref: str, types: set[str]) -> None:
        """Deletes the records `stage` wrote for `ref` (of the types it wrote, and `types`)."""
        known = [row[0] for row in db.execute("SELECT type FROM _types WHERE stage = ?", (stage,))]
        for type_ in sorted(set(known) | types):
            try:
                db.execute(f'DELETE FROM "{type_}" WHERE _stage = ? AND _ref = ?', (stage, ref))
            except sqlite3.OperationalError as exc:
                if "no such table" not in str(exc):  # a table dropped by hand: nothing to do
                    raise

    def _insert(self, record: Record) -> str:
        """The statement writing `record`, which writes nothing (rowcount 0) if its key is
        taken: `_replace` has deleted what this (stage, ref) wrote before, so a row still
        holding the key belongs to another stage or input."""
        shape = (record.type, *record.data)
        sql = self._statements.get(shape)
        if sql is None:
            names = ["key", "_stage", "_ref", "_updated", KINDS, *record.data]
            columns_sql = ", ".join(f'"{n}"' for n in names)
            marks = ", ".join("?" * len(names))
            sql = (
                f'INSERT INTO "{record.type}" ({columns_sql}) VALUES ({marks})'
                " ON CONFLICT (key) DO NOTHING"
            )
            self._statements[shape] = sql
        return sql

    def _ensure_table(self, db: sqlite3.Connection, record: Record) -> None:
        columns = self._columns.get(record.type)
        if columns is None:
            same = db.execute(
                "SELECT name FROM sqlite_master WHERE type = 'table' AND name = ? COLLATE NOCASE",
                (record.type,),
            ).fetchone()
            if same is not None and same[0] != record.type:
                raise InvalidRecord(
                    f"record type {record.type!r}: the store has type {same[0]!r}, and types"
                    " differing only by case would share one table (SQLite ignores case)"
                )
            db.execute(
                f'CREATE TABLE IF NOT EXISTS "{record.type}" (key TEXT PRIMARY KEY,'
                f" _stage TEXT NOT NULL, _ref TEXT NOT NULL, _updated REAL NOT NULL, {KINDS} TEXT)"
            )
            self._ensure_indexes(db, record.type)
            columns = [row[1] for row in db.execute(f'PRAGMA table_info("{record.type}")')]
            self._columns[record.type] = columns
        for name in (KINDS, *record.data):  # tables of older stores have no KINDS
            if name not in columns:
                try:
                    self._check_case(record, name, columns)
                    db.execute(f'ALTER TABLE "{record.type}" ADD COLUMN "{name}"')
                except sqlite3.OperationalError as exc:
                    if "duplicate column" not in str(exc):
                        raise
                    # another process added it meanwhile: under this case, or another?
                    columns[:] = [r[1] for r in db.execute(f'PRAGMA table_info("{record.type}")')]
                    self._check_case(record, name, columns)
                    continue
                columns.append(name)

    @staticmethod
    def _check_case(record: Record, name: str, columns: list[str]) -> None:
        for column in columns:
            if column != name and column.lower() == name.lower():
                raise InvalidRecord(
                    f"record {record.type!r} key {record.key!r}: field {name!r}: the type has"
                    f" field {column!r}, and fields differing only by case would share one"
                    " column (SQLite ignores case)"
                )

    @staticmethod
    def _ensure_indexes(db: sqlite3.Connection, type_: str) -> None:
        """Creates `type_`'s indexes, dropping those of older stores under other names."""
        for name, columns in _indexes(type_).items():
            db.execute(f'CREATE INDEX IF NOT EXISTS "{name}" ON "{type_}" ({columns})')
        for old in _old_indexes(type_):
            if db.execute(
                "SELECT 1 FROM sqlite_master WHERE type = 'index' AND name = ? AND tbl_name = ?",
                (old, type_),
            ).fetchone():
                db.execute(f'DROP INDEX "{old}"')

    def _migrate(self, db: sqlite3.Connection) -> None:
        """Brings the indexes of a store written by an older crawlq up to date (once, by
        whichever process opens it first; nothing is written when they already are)."""
        tables = {
            row[0] for row in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")
        }
        indexes = {
            (row[0], row[1])
            for row in db.execute("SELECT name, tbl_name FROM sqlite_master WHERE type = 'index'")
        }
        stale = [
            type_
            for (type_,) in db.execute("SELECT DISTINCT type FROM _types ORDER BY type")
            if type_ in tables
            and (
                any((name, type_) not in indexes for name in _indexes(type_))
                or any((name, type_) in indexes for name in _old_indexes(type_))
            )
        ]
        if stale:
            with self._write_lock.held(), immediate(db):
                for type_ in stale:
                    self._ensure_indexes(db, type_)

    # -- reading --------------------------------------------------------------------------

    def types(self) -> list[str]:
        with self._lock:
            rows = self._db().execute("SELECT DISTINCT type FROM _types ORDER BY type").fetchall()
        return [row[0] for row in rows]

    def columns(self, type_: str) -> list[str]:
        """The record's fields, `key` first, in the order they first appeared."""
        return [c for c in self._table_columns(type_) if c not in _RESERVED or c == "key"]

    def _table_columns(self, type_: str) -> list[str]:
        check_name(type_, "record type")
        with self._lock:
            info = self._db().execute(f'PRAGMA table_info("{type_}")').fetchall()
        return [row[1] for row in info]

    def rows(
        self, type_: str, *, ref: str | None = None, stage: str | None = None
    ) -> Iterator[dict[str, Any]]:
        """Every record of `type_` (optionally those one stage wrote for one reference), by key,
        each field as written (lists, dicts, booleans) and None where a record lacks it.

        Read ROWS_PAGE records at a time, by key (the lock is not held between pages): memory
        stays flat however large the table, and records written meanwhile show up if their
        key is still ahead."""
        check_name(type_, "record type")
        where, args = [], []
        if stage is not None:
            where.append("_stage = ?")
            args.append(stage)
        if ref is not None:
            where.append("_ref = ?")
            args.append(ref)
        after: str | None = None
        while True:
            conditions = [*where, "key > ?"] if after is not None else where
            # every column, those another process just added too
            sql = f'SELECT * FROM "{type_}"'
            if conditions:
                sql += " WHERE " + " AND ".join(conditions)
            sql += " ORDER BY key LIMIT ?"
            with self._lock:
                try:
                    cursor = self._db().execute(
                        sql, [*args, *([after] if after is not None else []), ROWS_PAGE]
                    )
                except sqlite3.OperationalError as exc:
                    if "no such table" in str(exc):
                        return
                    raise
                page = cursor.fetchall()
            names = [d[0] for d in cursor.description]
            shown = [(i, n) for i, n in enumerate(names) if n not in _RESERVED or n == "key"]
            read = row_reader(names, shown, lacking=True)
            for row in page:
                yield read(row)
            if len(page) < ROWS_PAGE:
                return
            after = page[-1][names.index("key")]

    def column_kinds(self, type_: str) -> dict[str, set[str]]:
        """The kinds of value each field of `type_` holds in some record (None left out), in
        one pass over the table: SQLite's types (`integer`, `real`, `text`, `blob`), and
        `bool` and `json` (a list or dict) where `_kinds` notes them."""
        table = self._table_columns(type_)
        columns = [c for c in table if c not in _RESERVED]
        if not columns:
            return {"key": {"text"}}

        def held(column: str) -> str:
            sqlite_type = f'typeof("{column}")'
            if KINDS not in table:
                return sqlite_type
            return f"coalesce(json_extract({KINDS}, '$.{column}'), {sqlite_type})"

        kinds = ", ".join(f"group_concat(DISTINCT {held(c)})" for c in columns)
        with self._lock:
            try:
                found = self._db().execute(f'SELECT {kinds} FROM "{type_}"').fetchone()
            except sqlite3.OperationalError as exc:
                if "no such table" in str(exc):
                    return {}
                raise
        out = {"key": {"text"}}
        for name, listed in zip(columns, found, strict=True):
            out[name] = set((listed or "").split(",")) - {"", "null"}  # null: None given
        return out

    def records(self, stage: str, ref: str) -> list[Record]:
        """What `stage` wrote for `ref`, as records, their fields as written (in a store from
        before `_kinds`, nested values are their JSON text and fields that are None left out).

        Read in one read transaction, so from one snapshot: all of one run of `stage` over
        `ref`, never part of one and part of the next another process wrote meanwhile. It
        takes no write lock (WAL: writers go on; they just are not seen until the next call)."""
        out: list[Record] = []
        with self._lock:
            db = self._db()
            db.execute("BEGIN")  # deferred: the snapshot is taken by the first SELECT
            try:
                types = [
                    r[0]
                    for r in db.execute(
                        "SELECT type FROM _types WHERE stage = ? ORDER BY type", (stage,)
                    ).fetchall()
                ]
                for type_ in types:
                    try:
                        cursor = db.execute(
                            f'SELECT * FROM "{type_}" WHERE _stage = ? AND _ref = ? ORDER BY key',
                            (stage, ref),
                        )
                    except sqlite3.OperationalError as exc:
                        if "no such table" in str(exc):  # dropped by hand: nothing there
                            continue
                        raise
                    names = [d[0] for d in cursor.description]
                    key = names.index("key")
                    shown = [(i, n) for i, n in enumerate(names) if n not in _RESERVED]
                    read = row_reader(names, shown, lacking=False)
                    for row in cursor:
                        out.append(_stored(type_, row[key], read(row)))
            finally:
                if db.in_transaction:
                    db.execute("COMMIT")
        return out

    def refs(self, stage: str) -> list[str]:
        """Every input reference `stage` has produced output for, in order."""
        with self._lock:
            rows = (
                self._db()
                .execute("SELECT ref FROM _outputs WHERE stage = ? ORDER BY ref", (stage,))
                .fetchall()
            )
        return [row[0] for row in rows]

    def done(self) -> dict[str, int]:
        """How many inputs each stage has produced output for."""
        with self._lock:
            rows = (
                self._db().execute("SELECT stage, COUNT(*) FROM _outputs GROUP BY stage").fetchall()
            )
        return {stage: count for stage, count in rows}

    def count(self, type_: str) -> int:
        check_name(type_, "record type")
        with self._lock:
            try:
                return int(self._db().execute(f'SELECT COUNT(*) FROM "{type_}"').fetchone()[0])
            except sqlite3.OperationalError as exc:
                if "no such table" in str(exc):
                    return 0
                raise


def as_records(items: Iterable[Record] | Record | None) -> list[Record]:
    """What a stage function returned, as a list of records."""
    if items is None:
        return []
    if isinstance(items, Record):
        return [items]
    records = list(items)
    for item in records:
        if not isinstance(item, Record):
            raise ConfigError(f"a stage must return Record objects, got {type(item).__name__}")
    return records
