"""The page budget of a crawl: how many distinct URLs it may ever admit, kept on disk so a
resumed crawl (and every process of it) counts against the same total.

It remembers each URL it charged for (a 64-bit digest), and a URL admitted again is free: a
Redis that lost its last writes in a crash has the crawl fetch again the pages that found
them and schedule their links again, and a budget that counted admissions charged those
links twice (a crawl near its budget then ended that many pages short). Charging each URL
once needs no refunds either: two pages that find the same new link at once charge it once,
whichever of them gets it into the queue."""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from contextlib import closing
from pathlib import Path

from ..groupcommit import GroupCommit
from ..identity import key_hash
from ..writelock import WriteLock, open_shared

BUDGET_FILE = "budget.sqlite"
#: URLs looked up in one query (SQLite's default limit of bound parameters is 999).
LOOKUP_BATCH = 500

_SCHEMA = """
CREATE TABLE IF NOT EXISTS budget (id INTEGER PRIMARY KEY, used INTEGER);
CREATE TABLE IF NOT EXISTS charged (digest INTEGER PRIMARY KEY);
INSERT OR IGNORE INTO budget (id, used) VALUES (1, 0);
"""


class PageBudget:
    """`admit(urls)` says which URLs may be scheduled: those charged before, and new ones
    while the budget lasts; `waive(urls)` makes URLs free without charging them. Both from
    the tasks of a worker are group-committed: one transaction for all that are waiting (a
    crawl admits a page's links hundreds of times a second)."""

    def __init__(self, directory: Path | str, limit: int | None) -> None:
        self.limit = limit
        self._path = Path(directory) / BUDGET_FILE
        self._write_lock = WriteLock(str(self._path))
        self._connection: sqlite3.Connection | None = None
        self._commit = GroupCommit(self._admit_all, "crawlq-budget")  # (urls, waived) each

    def _db(self) -> sqlite3.Connection:
        if self._connection is None:
            self._connection = open_shared(self._path, _SCHEMA)
        return self._connection

    def _admit_all(self, batches: list[tuple[Sequence[str], bool]]) -> list[list[str]]:
        assert self.limit is not None
        db = self._db()
        digests = [[key_hash(url) for url in urls] for urls, _ in batches]
        wanted = list({digest for batch in digests for digest in batch})
        with self._write_lock.transaction(db):
            known: set[int] = set()
            for start in range(0, len(wanted), LOOKUP_BATCH):
                some = wanted[start : start + LOOKUP_BATCH]
                query = f"SELECT digest FROM charged WHERE digest IN ({','.join('?' * len(some))})"
                known.update(digest for (digest,) in db.execute(query, some))
            (used,) = db.execute("SELECT used FROM budget WHERE id = 1").fetchone()
            left = self.limit - used
            charged: list[tuple[int]] = []
            waived: list[tuple[int]] = []
            admitted: list[list[str]] = []
            for (urls, free), batch in zip(batches, digests, strict=True):
                taken: set[int] = set()
                admitted.append([])
                for url, digest in zip(urls, batch, strict=True):
                    if digest in taken:
                        continue
                    if digest not in known:
                        if not free and len(charged) >= left:
                            continue
                        known.add(digest)
                        (waived if free else charged).append((digest,))
                    taken.add(digest)
                    admitted[-1].append(url)
            db.executemany("INSERT INTO charged (digest) VALUES (?)", charged + waived)
            db.execute("UPDATE budget SET used = ? WHERE id = 1", (used + len(charged),))
        return admitted

    async def admit(self, urls: Sequence[str]) -> list[str]:
        """The URLs that may be scheduled, in their order, once each. Without a limit: all."""
        if self.limit is None or not urls:
            return list(urls)
        return await self._commit((urls, False))

    async def waive(self, urls: Sequence[str]) -> None:
        """Admits `urls` from now on without charging them: pages fetched already (a URL a
        redirect led to), whose links found by any process of the crawl must cost nothing."""
        if self.limit is not None and urls:
            await self._commit((urls, True))

    def used(self) -> int:
        """How many URLs were charged for (blocking: for tools and tests)."""
        if not self._path.exists():
            return 0
        with closing(sqlite3.connect(self._path)) as db:
            (used,) = db.execute("SELECT used FROM budget WHERE id = 1").fetchone()
        return int(used)

    async def aclose(self) -> None:
        await self._commit.close(self._close)

    def _close(self) -> None:
        if self._connection is not None:
            self._connection.close()
            self._connection = None
        self._write_lock.close()
