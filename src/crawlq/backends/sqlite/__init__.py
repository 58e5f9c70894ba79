from .backend import DEFAULT_URL, SQLiteBackend

__all__ = ["DEFAULT_URL", "SQLiteBackend"]
