"""Observability: the web dashboard, Prometheus metrics, structured logs, the terminal view."""

from __future__ import annotations

from .logs import configure as configure_logging
from .logs import task_fields, task_scope
from .metrics import WorkerMetrics, worker_metrics

__all__ = ["WorkerMetrics", "configure_logging", "task_fields", "task_scope", "worker_metrics"]
