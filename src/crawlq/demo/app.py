"""The demo's ETL over the data of a finished `crawlq demo` run, for the commands that work
on stored data: `crawlq reprocess crawlq.demo.app:app parse`, `crawlq export ...`,
`crawlq worker crawlq.demo.app:app --queue parse`. The folder is ./crawlq-demo, or
CRAWLQ_DEMO_DIR. It knows no partner site: fetching would fail (no name resolves).
"""

from __future__ import annotations

import os
from pathlib import Path

from .etl import EtlConfig, build

etl = build(EtlConfig(data=Path(os.environ.get("CRAWLQ_DEMO_DIR", "crawlq-demo"))))
app = etl.app
pipeline = etl.pipeline
