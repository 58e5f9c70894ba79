from .runner import DEFAULT_CONCURRENCY, Worker, WorkerStats
from .supervisor import supervise

__all__ = ["DEFAULT_CONCURRENCY", "Worker", "WorkerStats", "supervise"]
