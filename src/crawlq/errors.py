"""The exceptions crawlq raises, all rooted at :class:`CrawlqError`.

    CrawlqError
    ├── ConfigError                 bad settings: an option, a limit, a task definition
    ├── BackendError                the backend failed or cannot be used
    │   ├── BackendUnavailable      cannot be reached or opened
    │   └── BackendCorrupt          not a crawlq database, or damaged
    ├── UnknownQueue                no task or stored queue has this name
    ├── InvalidElement              not JSON, too large, or an unusable URL
    └── Permanent                   raised by a task: retrying cannot help, dead-letter it now

Every error carries the context it is about (queue, element, URL) in its message.
"""

from __future__ import annotations


class CrawlqError(Exception):
    """The root of every crawlq error."""


class ConfigError(CrawlqError):
    """A setting, limit or task definition is not valid."""


class BackendError(CrawlqError):
    """The backend failed or cannot be used."""


class BackendUnavailable(BackendError):
    """The backend cannot be reached or opened."""


class BackendCorrupt(BackendError):
    """The backend's store is not a crawlq database or is damaged."""


class UnknownQueue(CrawlqError):
    """No task and no stored queue has this name."""

    def __init__(self, queue: str) -> None:
        super().__init__(f"unknown queue {queue!r}")
        self.queue = queue


class InvalidElement(CrawlqError):
    """An element cannot be queued: not JSON, too large, or a malformed URL."""

    def __init__(self, reason: str, *, queue: str | None = None) -> None:
        where = f" for queue {queue!r}" if queue else ""
        super().__init__(f"invalid element{where}: {reason}")
        self.queue = queue
        self.reason = reason


class Permanent(CrawlqError):
    """Raised by a task when retrying cannot help (a 404, a page too large): the element goes
    to the dead letters at once, with this message as its error."""
