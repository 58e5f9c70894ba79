"""Pipelines: stages (fetch -> parse -> normalize, or any chain), each its own queue, each
output stored (WARC for the fetch stage, the results store for the others), the next stage
scheduled with a reference; `reprocess` re-runs a stage and what follows from stored inputs.

    pipeline.py   Pipeline, Stage: declaring stages, running them, reprocessing
"""

from ..crawl.warc import StoredResponse
from ..results import Record, ResultsStore
from .pipeline import Pipeline, ReprocessResult, Stage

__all__ = ["Pipeline", "Record", "ReprocessResult", "ResultsStore", "Stage", "StoredResponse"]
