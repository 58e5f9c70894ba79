"""Taking a SQLite database's write lock in turn, without SQLite's polling.

A writer that finds a database locked sleeps in SQLite's busy handler in growing steps (1, 2,
5, 10 ... 100 ms), however soon the lock is freed. With a fetch process and a parse process
writing one queue, the fetch process spent a third of its run asleep there. So crawlq's
writers first take an exclusive flock on a file beside the database: the kernel hands it to
the next waiter the moment it is released, and BEGIN IMMEDIATE then finds the database free
(other programs writing the same file still meet SQLite's busy handler, as before). A process
that dies releases its flock with its files, so a crash leaves nothing to clean up.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import sqlite3
from collections.abc import Iterator

SUFFIX = "-writer"


@contextlib.contextmanager
def immediate(db: sqlite3.Connection) -> Iterator[None]:
    """A write transaction that takes SQLite's lock at once (so reads inside decide on the
    latest state): committed at the end, rolled back on any error."""
    db.execute("BEGIN IMMEDIATE")
    try:
        yield
        db.execute("COMMIT")
    except BaseException:
        # SQLite may have rolled back by itself (after a full disk, say); should ROLLBACK fail
        # too, the error that caused it says more, and SQLite undoes it on reopening.
        if db.in_transaction:
            with contextlib.suppress(sqlite3.Error):
                db.execute("ROLLBACK")
        raise


class WriteLock:
    """The turn to write `database`. One per connection: flock excludes other open files,
    not other threads sharing this one, so threads sharing a connection also share a lock
    of their own. A database that is not a plain file (":memory:"), or whose folder takes no
    new file, goes without: SQLite's busy handler alone decides then."""

    def __init__(self, database: str) -> None:
        self.path = database + SUFFIX
        self._usable = database not in ("", ":memory:") and not database.startswith("file:")
        self._fd: int | None = None
        self._pid = 0

    def _descriptor(self) -> int | None:
        if not self._usable:
            return None
        if self._fd is not None and self._pid != os.getpid():
            # A forked child shares its parent's open file, and with it the parent's lock.
            self._fd = None
        if self._fd is None:
            try:
                self._fd = os.open(self.path, os.O_RDONLY | os.O_CREAT | os.O_CLOEXEC, 0o644)
            except OSError:
                self._usable = False
                return None
            self._pid = os.getpid()
        return self._fd

    @contextlib.contextmanager
    def held(self) -> Iterator[None]:
        fd = self._descriptor()
        if fd is None:
            yield
            return
        fcntl.flock(fd, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)

    @contextlib.contextmanager
    def transaction(self, db: sqlite3.Connection) -> Iterator[None]:
        """`immediate(db)` in this connection's turn."""
        with self.held(), immediate(db):
            yield

    def close(self) -> None:
        if self._fd is not None and self._pid == os.getpid():
            os.close(self._fd)
        self._fd = None
