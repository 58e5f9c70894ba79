"""Taking a SQLite database's write lock in turn, without SQLite's polling.

A writer that finds a database locked sleeps in SQLite's busy handler in growing steps (1, 2,
5, 10 ... 100 ms), however soon the lock is freed. With a fetch process and a parse process
writing one queue, the fetch process spent a third of its run asleep there. So crawlq's
writers first take an exclusive flock on a file beside the database: the kernel hands it to
the next waiter the moment it is released, and BEGIN IMMEDIATE then finds the database free
(other programs writing the same file still meet SQLite's busy handler, as before). A process
that dies releases its flock with its files, so a crash leaves nothing to clean up. One that
is stopped inside a write keeps it, and every other writer waits: so crawlq's commands stop
on Ctrl-Z (SIGTSTP) only once their write turns are over (`stop_between_writes`). SIGSTOP
cannot wait: after LONG_WAIT seconds each waiter logs which process holds the turn, and
again each LONG_WAIT.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import signal
import sqlite3
import threading
import time
from collections.abc import Iterator
from pathlib import Path

from .observe.logs import logger

SUFFIX = "-writer"
#: Seconds a writer waits for its turn before it says so (then again each as long).
LONG_WAIT = 30.0

log = logger("crawlq.writelock")


def open_shared(path: Path, schema: str, *, timeout: float = 30) -> sqlite3.Connection:
    """A SQLite file beside the queue that several processes write in turn (a results store,
    a page budget): its folder made, WAL, synced as the queue's own file (NORMAL), no implicit
    transactions (writers use `WriteLock.transaction`), `schema` run."""
    path.parent.mkdir(parents=True, exist_ok=True)
    connection = sqlite3.connect(
        path, timeout=timeout, isolation_level=None, check_same_thread=False
    )
    connection.execute("PRAGMA journal_mode=WAL")
    connection.execute("PRAGMA synchronous=NORMAL")
    connection.executescript(schema)
    return connection


@contextlib.contextmanager
def immediate(db: sqlite3.Connection) -> Iterator[None]:
    """A write transaction that takes SQLite's lock at once (so reads inside decide on the
    latest state): committed at the end, rolled back on any error."""
    try:
        db.execute("BEGIN IMMEDIATE")  # inside: a KeyboardInterrupt right after it rolls back
        yield
        db.execute("COMMIT")
    except BaseException:
        # SQLite may have rolled back by itself (after a full disk, say); should ROLLBACK fail
        # too, the error that caused it says more, and SQLite undoes it on reopening.
        if db.in_transaction:
            with contextlib.suppress(sqlite3.Error):
                db.execute("ROLLBACK")
        raise


class TurnTaken(Exception):
    """Another process has the turn to write, and the caller would rather not wait for it."""


class WriteLock:
    """The turn to write `database`. One per connection: flock excludes other open files,
    not other threads sharing this one, so threads sharing a connection also share a lock
    of their own. A database that is not a plain file (":memory:"), or whose folder takes no
    new file, goes without: SQLite's busy handler alone decides then."""

    def __init__(self, database: str) -> None:
        self.path = database + SUFFIX
        self._usable = database not in ("", ":memory:") and not database.startswith("file:")
        self._fd: int | None = None
        self._inode = ""  # the file's "dev:inode" as /proc/locks writes it
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
            stat = os.fstat(self._fd)
            self._inode = f"{os.major(stat.st_dev):02x}:{os.minor(stat.st_dev):02x}:{stat.st_ino}"
        return self._fd

    @contextlib.contextmanager
    def held(self, *, wait: bool = True) -> Iterator[None]:
        """The turn, waited for; or, unless `wait`, TurnTaken at once if another has it."""
        fd = self._descriptor()
        if fd is None:
            yield
            return
        _turns.enter()
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                if not wait:
                    raise TurnTaken(self.path) from None
                with _waits.waiting(self.path, self._inode):
                    fcntl.flock(fd, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(fd, fcntl.LOCK_UN)
        finally:
            _turns.leave()

    def wait_for_turn(self) -> None:
        """Returns once no other process has the turn (without keeping it: another may take
        it next), so that a caller can wait for it before it takes what it shares."""
        with self.held():
            pass

    @contextlib.contextmanager
    def transaction(self, db: sqlite3.Connection, *, wait: bool = True) -> Iterator[None]:
        """`immediate(db)` in this connection's turn (see `held`)."""
        with self.held(wait=wait), immediate(db):
            yield

    def close(self) -> None:
        if self._fd is not None and self._pid == os.getpid():
            os.close(self._fd)
        self._fd = None


class _LongWaits:
    """Writers waiting for their turn, looked at by one thread every LONG_WAIT / 3 seconds
    while there are any: a wait costs a dict entry, and only a long one costs a log line."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        # ticket -> path, its file's "dev:inode" as /proc/locks writes it, since, next word
        self._waiters: dict[int, tuple[str, str, float, float]] = {}
        self._thread: threading.Thread | None = None
        self._count = 0

    @contextlib.contextmanager
    def waiting(self, path: str, inode: str) -> Iterator[None]:
        now = time.monotonic()
        with self._lock:
            self._count += 1
            ticket = self._count
            self._waiters[ticket] = (path, inode, now, now + LONG_WAIT)
            if self._thread is None:
                thread = threading.Thread(
                    target=self._watch, name="crawlq-writelock-watch", daemon=True
                )
                with contextlib.suppress(RuntimeError):  # no new threads (shutting down)
                    thread.start()
                    self._thread = thread
        try:
            yield
        finally:
            with self._lock:
                del self._waiters[ticket]

    def _watch(self) -> None:
        while True:
            time.sleep(LONG_WAIT / 3)
            now = time.monotonic()
            with self._lock:
                if not self._waiters:
                    self._thread = None
                    return
                due = [(t, w) for t, w in self._waiters.items() if w[3] <= now]
                for ticket, (path, inode, since, _) in due:
                    self._waiters[ticket] = (path, inode, since, now + LONG_WAIT)
            for _, (path, inode, since, _) in due:
                log.warning(
                    "waiting %.0fs for the turn to write %s, held by %s (one stopped mid-write "
                    "by Ctrl-Z or SIGSTOP keeps it until it continues or ends)",
                    now - since,
                    path.removesuffix(SUFFIX),
                    holder(inode),
                )


def holder(inode: str) -> str:
    """Which process holds the flock on the file `inode` ("dev:inode" as /proc/locks writes
    it), or "an unknown process" where it cannot tell."""
    try:
        with open("/proc/locks") as locks:
            lines = locks.read().splitlines()
    except OSError:
        return "an unknown process"
    for line in lines:
        fields = line.split()
        # "1: FLOCK  ADVISORY  WRITE 1234 fd:01:5678 0 EOF"; waiters' lines carry "->"
        if len(fields) >= 6 and fields[1] == "FLOCK" and fields[5] == inode:
            return f"process {fields[4]}"
    return "an unknown process"


class _Turns:
    """This process's write turns, taken or waited for, so that a terminal's stop (Ctrl-Z)
    comes between them. The signal handler runs in the main thread, which may itself be in
    `enter` or `leave` holding the lock: it then only marks the stop, which `leave` sees."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._held = 0
        self._stop = False

    def enter(self) -> None:
        with self._lock:
            self._held += 1

    def leave(self) -> None:
        with self._lock:
            self._held -= 1
        if self._stop and not self._held:  # read again, outside: a stop marked meanwhile
            self._stop_if_free(timeout=-1)

    def stop_requested(self, _signum: int, _frame: object) -> None:
        self._stop = True
        self._stop_if_free(timeout=0.2)  # a thread's enter or leave takes microseconds

    def _stop_if_free(self, *, timeout: float) -> None:
        if not self._lock.acquire(timeout=timeout):
            return  # this very thread holds it, inside enter or leave: `leave` stops
        try:
            stopping = self._stop and not self._held
            if stopping:
                self._stop = False
        finally:
            self._lock.release()
        if stopping:
            os.kill(os.getpid(), signal.SIGSTOP)


def stop_between_writes() -> None:
    """Ctrl-Z (SIGTSTP) stops this process once none of its threads holds or waits for a
    write turn, so a stopped crawlq command never keeps every other writer waiting. Only
    from the main thread, and only where SIGTSTP is not handled already (an application's
    own handler stays)."""
    if threading.current_thread() is not threading.main_thread():
        return
    if signal.getsignal(signal.SIGTSTP) is signal.SIG_DFL:
        signal.signal(signal.SIGTSTP, _terminal_stop)


def _terminal_stop(signum: int, frame: object) -> None:
    _turns.stop_requested(signum, frame)  # the module's: a forked child has its own


_waits = _LongWaits()
_turns = _Turns()


def _forgotten_in_child() -> None:
    """A forked child has none of its parent's threads, nor its waits or turns."""
    global _waits, _turns
    _waits = _LongWaits()
    _turns = _Turns()


os.register_at_fork(after_in_child=_forgotten_in_child)
