"""Backends by URL: `sqlite:///path.db` (the default, embedded), `redis://host:port/db`
(or `rediss://`, TLS) shared by many machines; PostgreSQL later."""

from __future__ import annotations

import time
from collections.abc import Callable

from ..errors import ConfigError
from ..observe.logs import redact
from .base import Backend
from .sqlite import DEFAULT_URL, SQLiteBackend

__all__ = ["DEFAULT_URL", "Backend", "open_backend"]


def open_backend(
    url: str | None = None, *, clock: Callable[[], float] | None = None, create: bool = True
) -> Backend:
    """A backend for `url`, not yet opened; `create=False` refuses to make a new database.

    `clock` replaces the backend's own time (tests drive it by hand). Without one, SQLite uses
    this machine's clock and Redis the server's, so every machine sees one time."""
    url = url or DEFAULT_URL
    scheme = url.partition(":")[0]
    if scheme == "sqlite":
        return SQLiteBackend(url, clock=clock or time.time, create=create)
    if scheme in ("redis", "rediss"):
        from .redis import RedisBackend  # redis-py and what it imports: only for Redis

        return RedisBackend(url, clock=clock, create=create)
    if scheme in ("postgresql", "postgres"):
        raise ConfigError(f"the {scheme} backend is not available yet; use sqlite or redis")
    raise ConfigError(
        f"unknown backend URL {redact(url)!r}: expected sqlite:///path/to/file.db "
        "or redis://host:port/db"
    )
