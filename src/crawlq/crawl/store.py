"""Where raw responses go: a content store. `WarcStore` writes WARC files and indexes each
record (URL, time, file, offset) in a SQLite file beside them, so later stages read a
response back without fetching it again. Object storage would be another ContentStore.
The DOM of a page a browser rendered is stored beside its response, indexed apart
(`put_rendition`, `get_rendition`): `get` always reads what the server sent.

URLs are stored and looked up without their credentials (`http://***@host/`, redact.py).
"""

from __future__ import annotations

import sqlite3
from contextlib import closing
from pathlib import Path
from typing import Protocol

from ..groupcommit import GroupCommit
from .redact import redact_url
from .response import Response
from .warc import (
    DEFAULT_COMPRESS_LEVEL,
    DEFAULT_FILE_BYTES,
    RecordRef,
    Rendition,
    RotatingWarcWriter,
    StoredResponse,
    read_record,
    read_rendition,
)

INDEX_FILE = "index.sqlite"

_SCHEMA = """
CREATE TABLE IF NOT EXISTS responses (
    id INTEGER PRIMARY KEY,
    url TEXT NOT NULL,
    fetched_at REAL NOT NULL,
    status INTEGER NOT NULL,
    file TEXT NOT NULL,
    offset INTEGER NOT NULL,
    length INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS responses_by_url ON responses (url, fetched_at);
CREATE TABLE IF NOT EXISTS renditions (
    id INTEGER PRIMARY KEY,
    url TEXT NOT NULL,
    fetched_at REAL NOT NULL,
    file TEXT NOT NULL,
    offset INTEGER NOT NULL,
    length INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS renditions_by_url ON renditions (url, fetched_at);
"""
INSERT_RESPONSE = (
    "INSERT INTO responses (url, fetched_at, status, file, offset, length)"
    " VALUES (?, ?, ?, ?, ?, ?)"
)
INSERT_RENDITION = (
    "INSERT INTO renditions (url, fetched_at, file, offset, length) VALUES (?, ?, ?, ?, ?)"
)
_LATEST = (
    "SELECT file, offset, length FROM responses WHERE url = ?"
    " ORDER BY fetched_at DESC, id DESC LIMIT 1"
)
_LATEST_RENDITION = (
    "SELECT file, offset, length FROM renditions WHERE url = ?"
    " ORDER BY fetched_at DESC, id DESC LIMIT 1"
)


_Row = tuple[str, float, int, str, int, int]  # as INSERT_RESPONSE takes them
_RenditionRow = tuple[str, float, str, int, int]  # as INSERT_RENDITION takes them


class ContentStore(Protocol):
    async def put(self, response: Response) -> RecordRef:
        """Stores one response (one hop) once; returns where it is."""

    async def get(self, url: str) -> StoredResponse | None:
        """The latest stored response for `url`, or None."""

    async def put_rendition(self, rendition: Rendition) -> RecordRef:
        """Stores the DOM a browser rendered for a page; returns where it is."""

    async def get_rendition(self, url: str) -> Rendition | None:
        """The latest rendered DOM stored for `url`, or None."""

    async def sync(self) -> None:
        """Puts every response stored so far on disk, or raises: then some may not be."""

    async def aclose(self) -> None: ...


def open_index(path: Path) -> sqlite3.Connection:
    connection = sqlite3.connect(path, timeout=30, isolation_level=None)
    connection.execute("PRAGMA journal_mode=WAL")
    connection.execute("PRAGMA synchronous=FULL")
    connection.executescript(_SCHEMA)
    return connection


class WarcStore:
    """WARC files in `directory`, rotated at `max_file_bytes`, indexed in INDEX_FILE. All
    disk work runs on one thread of its own, off the event loop.

    Puts are group-committed: the thread takes every response waiting when it comes round
    and writes their records; each `put` returns once its response is in the WARC file.
    `sync` puts the records on disk, then indexes them in one transaction. A worker syncs
    before it acknowledges a batch of elements (`App.sync_shared`), so a power loss cannot
    leave a page done in the queue without its response, for one sync a batch. `get` finds
    responses not yet indexed all the same. A put the disk refused (full, read-only) fails
    alone and makes the next `sync` raise its error: the worker stops, its elements going
    back to the queue, rather than failing page after page into the dead letters."""

    def __init__(
        self,
        directory: Path | str,
        *,
        max_file_bytes: int = DEFAULT_FILE_BYTES,
        compress_level: int = DEFAULT_COMPRESS_LEVEL,
    ):
        self.directory = Path(directory)
        self._writer = RotatingWarcWriter(
            self.directory, max_file_bytes=max_file_bytes, compress_level=compress_level
        )
        self._index: sqlite3.Connection | None = None
        self._unindexed: list[_Row] = []  # written, not yet synced
        self._latest_unindexed: dict[str, RecordRef] = {}  # by redacted URL
        self._unindexed_renditions: list[_RenditionRow] = []
        self._latest_unindexed_renditions: dict[str, RecordRef] = {}
        self._failed_write: OSError | None = None  # since the last sync
        self._commit = GroupCommit(self._put_many, "crawlq-warc")

    def _connection(self) -> sqlite3.Connection:
        if self._index is None:
            self.directory.mkdir(parents=True, exist_ok=True)
            self._index = open_index(self.directory / INDEX_FILE)
        return self._index

    async def put(self, response: Response) -> RecordRef:
        return await self._commit(response)

    async def put_rendition(self, rendition: Rendition) -> RecordRef:
        return await self._commit(rendition)

    def _put_many(self, items: list[Response | Rendition]) -> list[RecordRef | BaseException]:
        """Writes the batch; a record that cannot be written fails alone."""
        refs: list[RecordRef | BaseException] = []
        for item, ref in zip(items, self._writer.write_many(items), strict=True):
            if isinstance(ref, Exception):
                if isinstance(ref, OSError):  # a full disk, a read-only one
                    self._failed_write = ref
                refs.append(ref)
                continue
            url = redact_url(item.url)
            if isinstance(item, Rendition):
                self._unindexed_renditions.append(
                    (url, item.fetched_at, ref.file, ref.offset, ref.length)
                )
                self._latest_unindexed_renditions[url] = ref
            else:
                self._unindexed.append(
                    (url, item.fetched_at, item.status, ref.file, ref.offset, ref.length)
                )
                self._latest_unindexed[url] = ref
            refs.append(ref)
        return refs

    async def sync(self) -> None:
        await self._commit.run(self._sync)

    def _sync(self) -> None:
        failed, self._failed_write = self._failed_write, None
        try:
            self._writer.sync()
        except OSError:
            self._forget_unindexed()  # their records may be lost; their pages are retried
            raise
        self._index_unindexed()
        if failed is not None:
            raise failed

    def _index_unindexed(self) -> None:
        if not self._unindexed and not self._unindexed_renditions:
            return
        connection = self._connection()
        connection.execute("BEGIN")
        try:
            connection.executemany(INSERT_RESPONSE, self._unindexed)
            connection.executemany(INSERT_RENDITION, self._unindexed_renditions)
            connection.execute("COMMIT")
        except BaseException:
            if connection.in_transaction:  # SQLite ends it itself on a full disk
                connection.execute("ROLLBACK")
            raise
        self._forget_unindexed()

    def _forget_unindexed(self) -> None:
        self._unindexed.clear()
        self._latest_unindexed.clear()
        self._unindexed_renditions.clear()
        self._latest_unindexed_renditions.clear()

    async def get(self, url: str) -> StoredResponse | None:
        return await self._commit.run(self._get, url)

    def _get(self, url: str) -> StoredResponse | None:
        ref = self._latest(url, self._latest_unindexed, _LATEST)
        return None if ref is None else read_record(self.directory, ref)

    async def get_rendition(self, url: str) -> Rendition | None:
        return await self._commit.run(self._get_rendition, url)

    def _get_rendition(self, url: str) -> Rendition | None:
        ref = self._latest(url, self._latest_unindexed_renditions, _LATEST_RENDITION)
        return None if ref is None else read_rendition(self.directory, ref)

    def _latest(self, url: str, unindexed: dict[str, RecordRef], query: str) -> RecordRef | None:
        """Where `url`'s latest record is: written since the last sync, else in the index."""
        redacted = redact_url(url)
        ref = unindexed.get(redacted)
        if ref is None:
            row = self._connection().execute(query, (redacted,)).fetchone()
            if row is not None:
                ref = RecordRef(file=row[0], offset=row[1], length=row[2])
        return ref

    def refs(self, url: str) -> list[RecordRef]:
        """Every stored record of `url`, oldest first (blocking: for tools and tests)."""
        with closing(open_index(self.directory / INDEX_FILE)) as connection:
            rows = connection.execute(
                "SELECT file, offset, length FROM responses WHERE url = ? ORDER BY id",
                (redact_url(url),),
            ).fetchall()
        return [RecordRef(file=f, offset=o, length=n) for f, o, n in rows]

    async def aclose(self) -> None:
        await self._commit.close(self._close)

    def _close(self) -> None:
        try:
            self._sync()
        finally:
            self._close_files()

    def _close_files(self) -> None:
        self._writer.close()
        if self._index is not None:
            self._index.close()
            self._index = None
