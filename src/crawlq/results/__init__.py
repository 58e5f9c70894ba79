"""Where pipeline stages put their records: SQLite tables, one per record type, upserted by
key, and exports of them to JSON lines, CSV and Parquet.

    store.py    ResultsStore, Record: tables, upserts, a stage's output replaced atomically
    export.py   export(store, type, path): .jsonl, .csv, .parquet
"""

from .export import FORMATS, export
from .store import Record, ResultsStore

__all__ = ["FORMATS", "Record", "ResultsStore", "export"]
