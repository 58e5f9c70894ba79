"""Writers of one SQLite file take turns through an flock beside it: held by one process (or
one connection), no other can take it; a forked child does not inherit its parent's turn; a
killed holder frees it; a Ctrl-Z stops a writer between its turns, never in one."""

from __future__ import annotations

import fcntl
import multiprocessing
import os
import signal
import threading
import time
from collections.abc import Callable
from multiprocessing.synchronize import Event as EventType
from pathlib import Path

import pytest

from crawlq import writelock
from crawlq.writelock import WriteLock

from .helpers import can_take

GUARD = 60.0  # seconds: only a failing test waits this long


def test_a_held_turn_excludes_every_other_writer(tmp_path: Path) -> None:
    lock, other = WriteLock(str(tmp_path / "q.db")), WriteLock(str(tmp_path / "q.db"))
    with lock.held():
        assert lock.path == str(tmp_path / "q.db-writer")
        assert not can_take(lock.path)
    assert can_take(lock.path)
    with other.held():  # a second connection of the same process is another writer
        assert not can_take(lock.path)
    lock.close()
    other.close()


def _child_tries(lock: WriteLock, answer: multiprocessing.SimpleQueue[bool]) -> None:
    fd = lock._descriptor()
    assert fd is not None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        answer.put(False)
    else:
        answer.put(True)


def test_a_forked_child_does_not_share_its_parents_turn(tmp_path: Path) -> None:
    context = multiprocessing.get_context("fork")
    lock = WriteLock(str(tmp_path / "q.db"))
    answer: multiprocessing.SimpleQueue[bool] = context.SimpleQueue()
    with lock.held():
        child = context.Process(target=_child_tries, args=(lock, answer))
        child.start()
        took = answer.get()
        child.join(30)
    assert took is False
    lock.close()


def _hold_forever(path: str, ready: multiprocessing.SimpleQueue[bool]) -> None:
    with WriteLock(path).held():
        ready.put(True)
        signal.pause()


def test_a_killed_holder_frees_the_turn(tmp_path: Path) -> None:
    context = multiprocessing.get_context("spawn")
    ready: multiprocessing.SimpleQueue[bool] = context.SimpleQueue()
    holder = context.Process(target=_hold_forever, args=(str(tmp_path / "q.db"), ready))
    holder.start()
    try:
        assert ready.get() is True
        assert not can_take(str(tmp_path / "q.db-writer"))
    finally:
        os.kill(holder.pid or 0, signal.SIGKILL)
        holder.join(30)
    assert can_take(str(tmp_path / "q.db-writer"))


def test_a_writer_kept_waiting_long_says_which_process_holds_the_turn(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A writer stopped mid-write (Ctrl-Z) keeps the turn, and the others wait: silently,
    they would look hung. After LONG_WAIT they say how long, and who holds it."""
    monkeypatch.setattr("crawlq.writelock.LONG_WAIT", 0.3)
    context = multiprocessing.get_context("spawn")
    ready: multiprocessing.SimpleQueue[bool] = context.SimpleQueue()
    holder = context.Process(target=_hold_forever, args=(str(tmp_path / "q.db"), ready))
    holder.start()
    lock = WriteLock(str(tmp_path / "q.db"))
    took = threading.Event()

    def write() -> None:
        with lock.held():
            took.set()

    writer = threading.Thread(target=write)
    try:
        assert ready.get() is True
        writer.start()
        deadline = time.monotonic() + 30
        while "waiting" not in caplog.text:
            assert time.monotonic() < deadline, "no word of the long wait"
            time.sleep(0.05)
        assert not took.is_set()
    finally:
        os.kill(holder.pid or 0, signal.SIGKILL)
        holder.join(30)
    writer.join(30)
    lock.close()
    assert took.is_set()
    assert f"for the turn to write {tmp_path / 'q.db'}, held by process {holder.pid}" in caplog.text


@pytest.mark.parametrize("database", [":memory:", "file:q?mode=memory"])
def test_a_database_that_is_no_plain_file_goes_without(
    tmp_path: Path, database: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    lock = WriteLock(database)
    with lock.held():
        pass
    assert list(tmp_path.iterdir()) == []


def test_a_folder_that_takes_no_file_leaves_the_turn_to_sqlite(tmp_path: Path) -> None:
    lock = WriteLock(str(tmp_path / "missing" / "q.db"))
    with lock.held():
        pass
    assert not (tmp_path / "missing").exists()


def process_state(pid: int) -> str:
    """A process's state letter from /proc: "T" once stopped."""
    with open(f"/proc/{pid}/stat") as stat:
        return stat.read().rsplit(")", 1)[1].split()[0]


def wait_until(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + GUARD
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.01)


def _hold_until_released(
    path: str, said: multiprocessing.SimpleQueue[str], release: EventType
) -> None:
    writelock.stop_between_writes()  # as crawlq's commands do

    def hold() -> None:
        with WriteLock(path).held():
            said.put("holding")
            release.wait()

    writer = threading.Thread(target=hold)
    writer.start()
    writer.join()
    said.put("released")
    while True:
        # Not signal.pause(): a signal that lands just before it would wait for another.
        time.sleep(0.05)


def test_a_terminal_stop_waits_for_the_write_turn_to_end(tmp_path: Path) -> None:
    """Ctrl-Z (SIGTSTP) in the middle of a write: the process stops once the turn is over,
    so no other writer waits on a stopped one; continued, it goes on writing."""
    context = multiprocessing.get_context("spawn")
    said: multiprocessing.SimpleQueue[str] = context.SimpleQueue()
    release = context.Event()
    path = str(tmp_path / "q.db")
    child = context.Process(target=_hold_until_released, args=(path, said, release))
    child.start()
    pid = child.pid or 0
    try:
        assert said.get() == "holding"
        os.kill(pid, signal.SIGTSTP)
        release.set()  # the write ends: only now may it stop
        wait_until(lambda: process_state(pid) == "T", "the process to stop")
        assert can_take(path + writelock.SUFFIX)
        os.kill(pid, signal.SIGCONT)
        assert said.get() == "released"

        os.kill(pid, signal.SIGTSTP)  # holding no turn: it stops at once
        wait_until(lambda: process_state(pid) == "T", "the process to stop again")
        assert can_take(path + writelock.SUFFIX)
        os.kill(pid, signal.SIGCONT)
        wait_until(lambda: process_state(pid) != "T", "the process to go on")
    finally:
        os.kill(pid, signal.SIGKILL)
        child.join(30)


def test_a_terminal_stop_handler_of_the_application_is_kept() -> None:
    def own(_signum: int, _frame: object) -> None: ...

    previous = signal.signal(signal.SIGTSTP, own)
    try:
        writelock.stop_between_writes()
        assert signal.getsignal(signal.SIGTSTP) is own
    finally:
        signal.signal(signal.SIGTSTP, previous)
