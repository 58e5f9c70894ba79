"""crawlq: a durable queue made for the web, and the workers that run its tasks.

app = crawlq.App("sqlite:///crawl.db")

@app.task(max_attempts=3)
async def fetch(ctx, url):
    ...
    await ctx.schedule(fetch, next_url)
"""

import logging

from .app import App
from .backends import DEFAULT_URL, Backend, open_backend
from .context import Context, SyncContext
from .errors import (
    BackendCorrupt,
    BackendError,
    BackendUnavailable,
    ConfigError,
    CrawlqError,
    InvalidElement,
    Permanent,
    UnknownQueue,
)
from .retry import Retry
from .tasks import Task
from .types import Limit, ScheduleResult
from .worker import Worker

__all__ = [
    "DEFAULT_URL",
    "App",
    "Backend",
    "BackendCorrupt",
    "BackendError",
    "BackendUnavailable",
    "ConfigError",
    "Context",
    "CrawlqError",
    "InvalidElement",
    "Limit",
    "Permanent",
    "Retry",
    "ScheduleResult",
    "SyncContext",
    "Task",
    "UnknownQueue",
    "Worker",
    "open_backend",
]
__version__ = "0.1.0"

logging.getLogger("crawlq").addHandler(logging.NullHandler())
