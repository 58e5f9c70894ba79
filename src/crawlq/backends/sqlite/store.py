"""The SQLite connection: opening, schema migrations, named queries, and transactions.

One `Store` belongs to one thread. Several processes may share the file: WAL mode lets readers
run beside the one writer, and every change takes the write lock first (BEGIN IMMEDIATE), so
two claims never interleave.
"""

from __future__ import annotations

import os
import re
import sqlite3
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from importlib import resources
from pathlib import Path
from typing import Any

from ...errors import BackendCorrupt, BackendError, BackendUnavailable
from ...writelock import TurnTaken, WriteLock, immediate

SQLITE_MAGIC = b"SQLite format 3\x00"
BUSY_TIMEOUT_MS = 60_000
#: Write-ahead log pages after which the log is started again from its beginning (16 MB).
WAL_RESTART_PAGES = 4000
#: The log is restarted once the checkpointer has caught up to within this many pages.
RESTART_RESIDUE_PAGES = 200
#: Should the checkpointer fall behind, the writer checkpoints by itself at this size.
WAL_AUTOCHECKPOINT_PAGES = 4 * WAL_RESTART_PAGES
#: Least seconds between two background checkpoints, so that a busy writer's stream of commits
#: is copied and synced in batches rather than once per commit.
CHECKPOINT_GAP = 0.05
#: A disk with less free space than this, when SQLite reports an I/O error, is full: a log or
#: shared-memory file that cannot grow shows as an I/O error rather than SQLITE_FULL.
LOW_SPACE = 1 << 20


def _load_queries() -> dict[str, str]:
    text = resources.files(__package__).joinpath("queries.sql").read_text()
    queries: dict[str, str] = {}
    for chunk in re.split(r"^-- name: ", text, flags=re.MULTILINE)[1:]:
        name, _, body = chunk.partition("\n")
        queries[name.strip()] = body.strip()
    return queries


def _migrations() -> list[tuple[int, str]]:
    folder = resources.files(__package__).joinpath("migrations")
    found = []
    for entry in folder.iterdir():
        match = re.fullmatch(r"(\d{4})_\w+\.sql", entry.name)
        if match:
            found.append((int(match.group(1)), entry.read_text()))
    return sorted(found)


QUERIES = _load_queries()
MIGRATIONS = _migrations()
SCHEMA_VERSION = MIGRATIONS[-1][0]


def _disk_full(exc: sqlite3.Error, path: str) -> bool:
    name = getattr(exc, "sqlite_errorname", "")
    if name == "SQLITE_FULL":
        return True
    if not name.startswith("SQLITE_IOERR"):
        return False
    try:
        disk = os.statvfs(Path(path).parent)
    except OSError:
        return False
    return disk.f_bavail * disk.f_frsize < LOW_SPACE


def busy(exc: sqlite3.Error) -> bool:
    """Whether SQLite found the database locked by another connection (SQLITE_BUSY)."""
    return exc.sqlite_errorcode & 0xFF == sqlite3.SQLITE_BUSY


def translate(exc: sqlite3.Error, path: str) -> BackendError:
    """A driver error as the crawlq error a person can act on."""
    message = str(exc)
    if _disk_full(exc, path):
        return BackendError(
            f"disk full: SQLite database {path} cannot grow ({message}); nothing was"
            " changed by this call, free some space and try again"
        )
    if isinstance(exc, sqlite3.DatabaseError) and (
        "malformed" in message or "not a database" in message or "disk image" in message
    ):
        return BackendCorrupt(f"SQLite database {path} is damaged: {message}")
    if "unable to open" in message or "readonly" in message:
        return BackendUnavailable(f"cannot open SQLite database {path}: {message}")
    if "locked" in message or "busy" in message:
        return BackendUnavailable(f"SQLite database {path} stayed locked: {message}")
    return BackendError(f"SQLite database {path}: {message}")


class Store:
    """A migrated connection with named queries; not thread-safe: one user at a time."""

    def __init__(self, path: str, *, create: bool) -> None:
        self.path = path
        self._patient = True
        #: The schema version this process migrated the database from (None: it did not).
        self.migrated_from: int | None = None
        self._check_file(create)
        self._write_lock = WriteLock(path)
        try:
            self.db = sqlite3.connect(
                path, isolation_level=None, check_same_thread=False, timeout=BUSY_TIMEOUT_MS / 1000
            )
        except sqlite3.Error as exc:
            raise translate(exc, path) from exc
        try:
            self.db.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
            self._refuse_foreign()  # before anything writes: another program's file stays as is
            self.db.execute("PRAGMA journal_mode = WAL")
            self.db.execute("PRAGMA synchronous = NORMAL")
            # A worker's memory must not grow with the queue: the page cache is capped, and
            # the operating system's file cache holds the rest of a large database.
            self.db.execute("PRAGMA cache_size = -16384")
            self.db.execute("PRAGMA temp_store = MEMORY")
            self.db.execute(f"PRAGMA wal_autocheckpoint = {WAL_AUTOCHECKPOINT_PAGES}")
            self._migrate()
            self.db.executescript(QUERIES["create_temp_tables"])
            self._checkpointer = Checkpointer(path)
        except sqlite3.Error as exc:
            self.db.close()
            raise translate(exc, path) from exc
        except BaseException:
            self.db.close()
            raise

    def _check_file(self, create: bool) -> None:
        file = Path(self.path)
        if not file.parent.is_dir():
            raise BackendUnavailable(f"cannot create SQLite database {self.path}: no such folder")
        if not file.exists() or (not create and file.is_file() and file.stat().st_size == 0):
            if not create:
                raise BackendUnavailable(f"no crawlq database at {self.path}")
            return
        if file.is_dir():
            raise BackendUnavailable(f"{self.path} is a folder, not a SQLite database")
        with file.open("rb") as handle:
            head = handle.read(len(SQLITE_MAGIC))
        if head and head != SQLITE_MAGIC:
            raise BackendCorrupt(f"{self.path} is not a SQLite database")

    def _refuse_foreign(self) -> None:
        # One statement, so one snapshot: read apart, a process that made the schema between
        # the two reads (crawlq processes starting together on a new file) made a crawlq
        # database look foreign: version 0 from before, tables from after.
        version, tables = self.db.execute(
            "SELECT user_version, (SELECT count(*) FROM sqlite_master) FROM pragma_user_version"
        ).fetchone()
        if version == 0 and tables:
            raise BackendCorrupt(f"{self.path} is a SQLite database, but not crawlq's")

    def _migrate(self) -> None:
        version = self.db.execute("PRAGMA user_version").fetchone()[0]
        if version == SCHEMA_VERSION:
            return
        with immediate(self.db):
            version = self.db.execute("PRAGMA user_version").fetchone()[0]
            if version > SCHEMA_VERSION:
                raise BackendError(
                    f"{self.path} has schema {version}, newer than this crawlq knows"
                    f" ({SCHEMA_VERSION}): upgrade crawlq"
                )
            if version == 0:
                self._refuse_foreign()  # another process may have written it meanwhile
            self.migrated_from = version or None
            for number, script in MIGRATIONS:
                if number > version:
                    for statement in _statements(script):
                        self.db.execute(statement)
            self.db.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")

    @property
    def patient(self) -> bool:
        """Whether the connection waits for what another holds: the write turn (else a
        transaction raises TurnTaken), SQLite's lock (else SQLITE_BUSY at once, and
        TurnTaken from a transaction, which it rolled back), and the rest of a long log to
        copy (else it is left to `finish_log`). The event loop must not wait for them."""
        return self._patient

    @patient.setter
    def patient(self, patient: bool) -> None:
        if patient != self._patient:
            self.db.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS if patient else 0}")
            self._patient = patient

    @contextmanager
    def transaction(self) -> Iterator[None]:
        """Takes the write lock now, so that reads inside decide on the latest state."""
        try:
            with self._write_lock.transaction(self.db, wait=self._patient):
                yield
        except sqlite3.OperationalError as exc:
            if self._patient or not busy(exc):
                raise
            raise TurnTaken(self.path) from exc  # another program writes: wait for it elsewhere
        if self._checkpointer.wanted() and self._patient:
            self._restart_log()

    def wait_for_turn(self) -> None:
        """Returns once no other process has the write turn (see WriteLock.wait_for_turn)."""
        self._write_lock.wait_for_turn()

    @property
    def log_handed_over(self) -> bool:
        """The checkpointer left the rest of a long log to this connection's `finish_log`."""
        return self._checkpointer.restart_due

    def finish_log(self) -> None:
        """Copies the rest of a long log if it is still this connection's to copy."""
        if self._checkpointer.restart_due:
            self._restart_log()

    def _restart_log(self) -> None:
        """The log is long and the checkpointer has copied nearly all of it: copies the rest
        here, where no commit of ours slips in between, so that our next commit restarts it."""
        try:
            busy, _, _ = self.db.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
        except sqlite3.Error:
            return  # the transaction is committed all the same; the next commit tries again
        if not busy:
            self._checkpointer.restarted()

    def run(self, name: str, params: Any = ()) -> sqlite3.Cursor:
        return self.db.execute(QUERIES[name], params)

    def many(self, name: str, rows: Any) -> sqlite3.Cursor:
        return self.db.executemany(QUERIES[name], rows)

    def value(self, name: str, params: Any = ()) -> Any:
        row = self.db.execute(QUERIES[name], params).fetchone()
        return None if row is None else row[0]

    def close(self) -> None:
        self._checkpointer.close()
        self.db.close()
        self._write_lock.close()


class Checkpointer:
    """Copies committed pages from the write-ahead log into the database file, on a thread and
    connection of its own.

    A checkpoint writes pages scattered across the file and then syncs it: in a large queue,
    where a claim's pages are scattered, tens of milliseconds. Left to SQLite's automatic
    checkpoint, the commit that crosses the threshold pays all of it, so that one claim in a
    few stalls and the claim rate falls as the queue grows. Here PASSIVE checkpoints, which
    never block a writer, copy and sync beside it, woken by commits.

    The log starts again from its beginning only when a writer finds it wholly copied, which a
    busy writer never lets a checkpoint beside it achieve. So once the log is long and this
    thread has caught up to within a few pages, it hands over: the writer, right after its next
    commit, copies that small rest itself (see `Store.transaction`), and its following commit
    restarts the log. The writer's own automatic checkpoint, at a higher threshold, remains as
    the bound should this thread fall behind.
    """

    def __init__(self, path: str) -> None:
        self._db = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        self._db.execute("PRAGMA synchronous = NORMAL")
        self._db.execute("PRAGMA cache_size = 16")  # a checkpoint reads no b-tree pages
        self._wake = threading.Event()
        self._closing = threading.Event()
        self._restart_due = False
        self._done = 0
        self._thread = threading.Thread(
            target=self._run, name="crawlq-sqlite-checkpoint", daemon=True
        )
        self._thread.start()

    def wanted(self) -> bool:
        """After a commit: wakes the checkpointer; True when the writer should restart the log."""
        if self._restart_due:
            return True  # the checkpointer stays out of the writer's way meanwhile
        self._wake.set()
        return False

    @property
    def restart_due(self) -> bool:
        return self._restart_due

    def restarted(self) -> None:
        self._restart_due = False  # the next commit restarts the log, and wakes the thread

    def _run(self) -> None:
        while True:
            self._wake.wait()
            if self._closing.is_set():
                return
            self._wake.clear()
            try:
                busy, log, done = self._db.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
            except sqlite3.Error:
                busy, log, done = 1, 0, 0  # the writer's automatic checkpoint bounds the log
            copied = done - self._done if done >= self._done else done  # less: log restarted
            self._done = done
            if log < WAL_RESTART_PAGES or busy or log != done:
                self._closing.wait(CHECKPOINT_GAP)
            elif 0 <= copied <= RESTART_RESIDUE_PAGES:
                self._restart_due = True
            else:
                self._wake.set()  # catching up: copy again at once, the writer added little

    def close(self) -> None:
        self._closing.set()
        self._wake.set()
        self._thread.join()
        self._db.close()


def _statements(script: str) -> Iterator[str]:
    """Splits a migration into statements, keeping trigger bodies whole."""
    buffer = ""
    for line in script.splitlines(keepends=True):
        if line.lstrip().startswith("--") and not buffer.strip():
            continue
        buffer += line
        if sqlite3.complete_statement(buffer):
            yield buffer.strip()
            buffer = ""
    if buffer.strip():
        yield buffer.strip()
