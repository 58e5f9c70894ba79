"""Pipelines: stages (fetch -> parse -> normalize, or any chain), each its own queue, each
output stored (WARC for the fetch stage, the results store for the others), the next stage
scheduled with a reference; `reprocess` re-runs a stage and what follows from stored inputs.

    pipeline.py       Pipeline, Stage: declaring stages, running them, reprocessing
    registration.py   a running reprocess's registration, beaten (Heartbeat), and who is busy
    writer.py         stage outputs written to the results store on a thread of their own
"""

from ..crawl.warc import StoredResponse
from ..results import Record, ResultsStore
from .pipeline import Pipeline, ReprocessResult, Stage
from .registration import Heartbeat

__all__ = [
    "Heartbeat",
    "Pipeline",
    "Record",
    "ReprocessResult",
    "ResultsStore",
    "Stage",
    "StoredResponse",
]
