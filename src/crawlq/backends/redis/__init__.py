"""The Redis backend: `redis://host:port/db` (or `rediss://` for TLS), shared by many machines."""

from .backend import RedisBackend

__all__ = ["RedisBackend"]
