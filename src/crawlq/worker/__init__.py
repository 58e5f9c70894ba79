from .collector import collect_less_often
from .runner import DEFAULT_CONCURRENCY, Worker, WorkerStats
from .supervisor import supervise

__all__ = ["DEFAULT_CONCURRENCY", "Worker", "WorkerStats", "collect_less_often", "supervise"]
