"""Where pipeline stages put their records: SQLite tables, one per record type, by key, and
exports of them to JSON lines, CSV and Parquet.

    store.py    ResultsStore, Record: tables, a stage's output replaced atomically, keys owned
                by one output (KeyConflict), values checked (InvalidRecord)
    export.py   export(store, type, path): .jsonl, .csv, .parquet
"""

from .export import FORMATS, export
from .store import InvalidRecord, KeyConflict, Record, ResultsStore

__all__ = ["FORMATS", "InvalidRecord", "KeyConflict", "Record", "ResultsStore", "export"]
