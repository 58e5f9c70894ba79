"""The page budget of a crawl: how many URLs it may ever admit, kept on disk so a resumed
crawl (and every process of it) counts against the same total."""

from __future__ import annotations

import asyncio
import sqlite3
import threading
from pathlib import Path

from ..writelock import WriteLock

BUDGET_FILE = "budget.sqlite"


class PageBudget:
    """`reserve(n)` grants up to n of what is left; `refund(n)` returns what went unused."""

    def __init__(self, directory: Path | str, limit: int | None) -> None:
        self.limit = limit
        self._path = Path(directory) / BUDGET_FILE
        self._lock = threading.Lock()
        self._write_lock = WriteLock(str(self._path))
        self._connection: sqlite3.Connection | None = None

    def _db(self) -> sqlite3.Connection:
        if self._connection is None:
            self._path.parent.mkdir(parents=True, exist_ok=True)
            connection = sqlite3.connect(
                self._path, timeout=30, isolation_level=None, check_same_thread=False
            )
            connection.execute("PRAGMA journal_mode=WAL")
            connection.execute(
                "CREATE TABLE IF NOT EXISTS budget (id INTEGER PRIMARY KEY, used INTEGER)"
            )
            connection.execute("INSERT OR IGNORE INTO budget (id, used) VALUES (1, 0)")
            self._connection = connection
        return self._connection

    def _change(self, wanted: int, refund: bool) -> int:
        with self._lock:
            db = self._db()
            with self._write_lock.transaction(db):
                (used,) = db.execute("SELECT used FROM budget WHERE id = 1").fetchone()
                if refund:
                    granted = min(wanted, used)
                    used -= granted
                else:
                    assert self.limit is not None
                    granted = max(0, min(wanted, self.limit - used))
                    used += granted
                db.execute("UPDATE budget SET used = ? WHERE id = 1", (used,))
            return int(granted)

    async def reserve(self, wanted: int) -> int:
        if self.limit is None or wanted <= 0:
            return max(wanted, 0)
        return await asyncio.to_thread(self._change, wanted, False)

    async def refund(self, unused: int) -> None:
        if self.limit is not None and unused > 0:
            await asyncio.to_thread(self._change, unused, True)

    def used(self) -> int:
        with self._lock:
            (used,) = self._db().execute("SELECT used FROM budget WHERE id = 1").fetchone()
            return int(used)

    def close(self) -> None:
        with self._lock:
            if self._connection is not None:
                self._connection.close()
                self._connection = None
            self._write_lock.close()
