"""The App: tasks, limits and a backend URL; schedules work from async or plain sync code."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterable, Sequence
from inspect import iscoroutinefunction
from typing import Any, TypeVar, overload
from urllib.parse import urlsplit, urlunsplit

from . import checks
from .backends import DEFAULT_URL, Backend, open_backend
from .cron import Cron
from .errors import ConfigError, UnknownQueue
from .limits import check_pattern
from .observe.logs import redact
from .portal import Portal
from .retry import Retry
from .tasks import GroupOption, KeyFunction, Task, TaskOptions, group_option, prepare
from .types import (
    JSON,
    Limit,
    LimitRule,
    Mode,
    QueueConfig,
    QueueStats,
    Schedule,
    ScheduleResult,
)

F = TypeVar("F", bound=Callable[..., Any])
Target = Task[Any] | str

DEFAULT_LEASE = 60.0


def schedule_mode(only_if_earlier: bool, only_if_new: bool) -> Mode:
    if only_if_earlier and only_if_new:
        raise ConfigError("only_if_earlier and only_if_new exclude each other")
    if only_if_earlier:
        return Mode.ONLY_IF_EARLIER
    return Mode.ONLY_IF_NEW if only_if_new else Mode.OVERWRITE


#: Characters a password in a backend URL must have percent-encoded (%22 %27 %3C %3E): they
#: end a URL in a text, so `redact` could not mask the password before them.
_ENCODE_IN_USERINFO = frozenset("\"'<>")


def check_backend_url(url: str) -> str:
    """A backend URL that can be opened and shown: text without control characters, valid
    Unicode, a port in range. Errors show it with its credentials masked."""
    shown = redact(url) if isinstance(url, str) else repr(url)
    problem = None if isinstance(url, str) else f"is a {type(url).__name__}, not text"
    if problem is None:
        problem = checks.unicode_error(url)
        problem = f"is {problem}" if problem else None
    if problem is None and not url.isprintable():
        problem = "holds control characters"
    if problem is None:
        try:
            parts = urlsplit(url)
            parts.port  # noqa: B018 - raises ValueError for a malformed address
        except ValueError as exc:
            problem = f"is malformed: {exc}"
        else:
            userinfo, at, host = parts.netloc.rpartition("@")
            if at and any(c in _ENCODE_IN_USERINFO or c.isspace() for c in userinfo):
                # Where those end a URL in a text, it is not masked there: not shown at all.
                shown = urlunsplit(parts._replace(netloc=f"***@{host}"))
                problem = "has a quote, < > or a space in its user or password: percent-encode it"
    if problem:
        raise ConfigError(f"backend URL {checks.shorten(shown)} {problem}")
    return url


def delay(value: float) -> float:
    """Seconds until an element is due: at most 100 years either way (in the past: earlier
    among due elements)."""
    return checks.seconds(value, "seconds (the delay)", negative=True)


def limit_of(pattern: str, concurrency: int | None, interval: float) -> Limit:
    """A Limit for `pattern` from numbers given by people, or a ConfigError naming both."""
    try:
        if concurrency is not None:
            checks.integer(concurrency, "concurrency", low=1)
        return Limit(concurrency=concurrency, interval=interval)
    except (ValueError, ConfigError) as exc:
        raise ConfigError(f"limit {pattern!r}: {exc}") from None


class App:
    """Holds tasks and limits; connects lazily, once per event loop that uses it."""

    def __init__(
        self, backend: str | None = None, *, clock: Callable[[], float] | None = None
    ) -> None:
        """`clock` drives the backend's time (tests); by default each backend keeps its own."""
        self.url = check_backend_url(backend or DEFAULT_URL)
        self.clock = clock
        self.tasks: dict[str, Task[Any]] = {}
        self.limit_rules: dict[str, LimitRule] = {}
        self._backends: dict[asyncio.AbstractEventLoop, Backend] = {}
        self._opening: dict[asyncio.AbstractEventLoop, asyncio.Lock] = {}
        self._ready: dict[Backend, int] = {}  # the backends published to, at which epoch
        self._publishers: list[Callable[[Backend], Awaitable[object]]] = []
        self._portal = Portal()
        self._providers: dict[str, Callable[[], Any]] = {}
        self._shared: dict[asyncio.AbstractEventLoop, dict[str, Any]] = {}

    def __repr__(self) -> str:
        return f"<App {redact(self.url)} tasks={sorted(self.tasks)}>"

    # -- declaring ------------------------------------------------------------------------

    @overload
    def task(self, function: F) -> Task[Any]: ...

    @overload
    def task(
        self,
        *,
        queue: str | None = None,
        group: GroupOption = "host",
        key: KeyFunction | None = None,
        retry: Retry | None = None,
        max_attempts: int | None = None,
        lease: float = DEFAULT_LEASE,
        timeout: float | None = None,
        start: bool = False,
        seen: bool = False,
        cron: str | None = None,
        cron_tz: str = "UTC",
    ) -> Callable[[F], Task[Any]]: ...

    def task(
        self,
        function: F | None = None,
        *,
        queue: str | None = None,
        group: GroupOption = "host",
        key: KeyFunction | None = None,
        retry: Retry | None = None,
        max_attempts: int | None = None,
        lease: float = DEFAULT_LEASE,
        timeout: float | None = None,
        start: bool = False,
        seen: bool = False,
        cron: str | None = None,
        cron_tz: str = "UTC",
    ) -> Task[Any] | Callable[[F], Task[Any]]:
        """Registers a task. `start=True` marks an entry point of the job (`crawlq start`);
        `cron="0 2 * * *"` (in UTC, or the IANA zone `cron_tz`) makes it one that workers of
        its queue also run at each time the expression matches (cron.py), with the time as
        its element."""

        def register(fn: F) -> Task[Any]:
            queue_name = checks.name(fn.__name__ if queue is None else queue, "queue name")
            if queue_name in self.tasks:
                raise ConfigError(f"two tasks use queue {queue_name!r}: give one a queue= name")
            what = f"task {queue_name!r}:"
            schedule = None if cron is None else Cron.parse(cron, cron_tz)
            if schedule is not None and key is not None:
                raise ConfigError(f"{what} a cron task's elements are its times: it takes no key=")
            if checks.seconds(lease, f"{what} lease") <= 0:
                raise ConfigError(f"{what} lease must be positive, got {lease!r}")
            if timeout is not None and checks.seconds(timeout, f"{what} timeout") <= 0:
                raise ConfigError(f"{what} timeout must be positive, got {timeout!r}")
            policy = retry or Retry()
            if max_attempts is not None:
                checks.integer(max_attempts, f"{what} max_attempts", low=1)
                policy = Retry(
                    max_attempts=max_attempts,
                    base=policy.base,
                    factor=policy.factor,
                    cap=policy.cap,
                    jitter=policy.jitter,
                )
            starts = start or schedule is not None
            group_by, group_function = group_option(None if starts else group)
            options = TaskOptions(
                queue=queue_name,
                group_by=group_by,
                group_function=group_function,
                key=key,
                retry=policy,
                lease=lease,
                start=starts,
                seen=seen,
                timeout=timeout,
                cron=schedule,
            )
            task: Task[Any] = Task(fn, options)
            self.tasks[queue_name] = task
            self._ready.clear()  # store the new queue before the next use
            return task

        return register(function) if function is not None else register

    def limit(self, pattern: str, *, concurrency: int | None = None, interval: float = 0.0) -> None:
        """Limits every group matching the glob `pattern` (`*` is the default rule).
        `concurrency`: 1 to 2**53 - 1 or None (unlimited); `interval`: 0 to 100 years."""
        limit = limit_of(pattern, concurrency, interval)
        pattern = check_pattern(checks.name(pattern, "limit pattern"))
        self.limit_rules[pattern] = LimitRule(pattern=pattern, limit=limit)
        self._ready.clear()

    @property
    def start_tasks(self) -> list[Task[Any]]:
        return [task for task in self.tasks.values() if task.options.start]

    # -- connecting -----------------------------------------------------------------------

    async def backend(self) -> Backend:
        """This loop's backend, opened, with the app's queues and limits stored in it."""
        loop = asyncio.get_running_loop()
        backend = self._backends.get(loop)
        if backend is None:
            # Tasks asking at once (a crawl's seeding and its progress display) share one.
            async with self._opening.setdefault(loop, asyncio.Lock()):
                backend = self._backends.get(loop)
                if backend is None:
                    backend = open_backend(self.url, clock=self.clock)
                    await backend.open()
                    self._backends[loop] = backend
        await self.published(backend)
        return backend

    def also_publish(self, publisher: Callable[[Backend], Awaitable[object]]) -> None:
        """Has `publisher(backend)` store more that must be in the backend (a crawl's seeds)
        each time the app's queues and limits are stored."""
        self._publishers.append(publisher)

    async def published(self, backend: Backend) -> None:
        """Stores the app's queues and limit rules in `backend` unless they are there: once,
        and again in each new epoch (a Redis back from a crash may have lost them)."""
        if self._ready.get(backend) != backend.epoch:
            await self.publish(backend)

    async def publish(self, backend: Backend) -> None:
        """Stores the app's queues and limit rules in `backend`, then runs the publishers."""
        epoch = backend.epoch
        await backend.ensure_queues([task.queue_config for task in self.tasks.values()])
        if self.limit_rules:
            await backend.set_limits(list(self.limit_rules.values()))
        for publisher in self._publishers:
            await publisher(backend)
        self._ready[backend] = epoch

    # -- resources shared by the tasks of a worker ---------------------------------------

    def provide(self, name: str, factory: Callable[[], Any]) -> None:
        """Registers a resource every task of a worker shares (the fetcher, a store): built
        by `factory()` on first use in each event loop, closed (its `aclose()`) when the
        worker stops. One that writes files may have an `async def sync()` putting them on
        disk: the worker awaits it before it records elements done (`sync_shared`)."""
        self._providers[name] = factory

    def shared(self, name: str, default: Callable[[], Any] | None = None) -> Any:
        """This loop's instance of resource `name`, built from its provider or `default`."""
        resources = self._shared.setdefault(asyncio.get_running_loop(), {})
        if name not in resources:
            factory = self._providers.get(name, default)
            if factory is None:
                raise ConfigError(f"no shared resource {name!r}: register it with app.provide")
            resources[name] = factory()
        return resources[name]

    async def sync_shared(self) -> None:
        """Puts on disk what this loop's shared resources wrote (those with a `sync()`): a
        worker calls it before it records finished elements, so an element is never done in
        the queue while its output could still be lost to a power loss."""
        resources = self._shared.get(asyncio.get_running_loop(), {})
        syncs = [
            r.sync() for r in resources.values() if iscoroutinefunction(getattr(r, "sync", None))
        ]
        if syncs:
            await asyncio.gather(*syncs)

    async def close_shared(self) -> None:
        """Closes this loop's shared resources, the last built first."""
        resources = self._shared.pop(asyncio.get_running_loop(), {})
        for resource in reversed(list(resources.values())):
            close = getattr(resource, "aclose", None)
            if close is not None:
                await close()

    async def aclose(self) -> None:
        await self.close_shared()
        loop = asyncio.get_running_loop()
        self._opening.pop(loop, None)
        backend = self._backends.pop(loop, None)
        if backend is not None:
            self._ready.pop(backend, None)
            await backend.close()

    def close(self) -> None:
        """Closes the backend used by the sync API and its event loop."""
        if self._portal.running:
            self._portal.call(self.aclose())
        self._portal.close()

    def __enter__(self) -> App:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- scheduling -----------------------------------------------------------------------

    async def _queue_config(self, backend: Backend, name: str) -> QueueConfig:
        for config in await backend.queues():
            if config.name == name:
                return config
        raise UnknownQueue(name)

    async def prepare(
        self,
        target: Target,
        elements: Iterable[JSON],
        *,
        seconds: float = 0,
        priority: int = 0,
        only_if_earlier: bool = False,
        only_if_new: bool = False,
        revisit: bool = False,
        backend: Backend | None = None,
    ) -> list[Schedule]:
        backend = backend or await self.backend()
        mode = schedule_mode(only_if_earlier, only_if_new)
        due = backend.now() + delay(seconds)
        checks.integer(priority, "priority")
        task = target if isinstance(target, Task) else self.tasks.get(target)
        if task is not None:
            return [
                task.prepare(e, due=due, priority=priority, mode=mode, revisit=revisit)
                for e in elements
            ]
        config = await self._queue_config(backend, checks.name(target, "queue name"))
        return [
            prepare(config, e, due=due, priority=priority, mode=mode, revisit=revisit)
            for e in elements
        ]

    async def aschedule(
        self,
        target: Target,
        element: JSON,
        *,
        seconds: float = 0,
        priority: int = 0,
        **options: Any,
    ) -> ScheduleResult:
        """Schedules one element: added, or its due time and priority moved, never duplicated."""
        return await self.aschedule_many(
            target, [element], seconds=seconds, priority=priority, **options
        )

    async def aschedule_many(
        self,
        target: Target,
        elements: Iterable[JSON],
        *,
        seconds: float = 0,
        priority: int = 0,
        only_if_earlier: bool = False,
        only_if_new: bool = False,
        revisit: bool = False,
        backend: Backend | None = None,
    ) -> ScheduleResult:
        """Schedules many elements in one atomic step."""
        backend = backend or await self.backend()
        items = await self.prepare(
            target,
            elements,
            seconds=seconds,
            priority=priority,
            only_if_earlier=only_if_earlier,
            only_if_new=only_if_new,
            revisit=revisit,
            backend=backend,
        )
        return await backend.schedule(items)

    def schedule(
        self,
        target: Target,
        element: JSON,
        *,
        seconds: float = 0,
        priority: int = 0,
        **options: Any,
    ) -> ScheduleResult:
        """`aschedule` for plain synchronous code."""
        return self._portal.call(
            self.aschedule(target, element, seconds=seconds, priority=priority, **options)
        )

    def schedule_many(
        self,
        target: Target,
        elements: Iterable[JSON],
        *,
        seconds: float = 0,
        priority: int = 0,
        **options: Any,
    ) -> ScheduleResult:
        """`aschedule_many` for plain synchronous code."""
        return self._portal.call(
            self.aschedule_many(
                target, list(elements), seconds=seconds, priority=priority, **options
            )
        )

    def stats(self, queues: Sequence[str] | None = None) -> list[QueueStats]:
        async def read() -> list[QueueStats]:
            return await (await self.backend()).queue_stats(queues)

        return self._portal.call(read())
