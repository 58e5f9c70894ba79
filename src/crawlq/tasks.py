"""Tasks: plain functions, async or sync, each with its own queue and options."""

from __future__ import annotations

import asyncio
import contextvars
import inspect
import re
import reprlib
from collections.abc import Callable
from concurrent.futures import Executor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from .checks import MAX_NAME, shorten, unicode_error
from .cron import Cron, fire, is_trigger
from .errors import ConfigError, InvalidElement
from .grouping import GroupFunction, element_url, group_of
from .identity import canonical_json, check_key
from .observe.logs import redact
from .retry import Retry
from .types import JSON, GroupBy, Mode, QueueConfig, Schedule

if TYPE_CHECKING:
    from .context import Context

R = TypeVar("R")
KeyFunction = Callable[[Any], str]
GroupOption = str | GroupFunction | None


@dataclass(frozen=True, kw_only=True, slots=True)
class TaskOptions:
    queue: str
    group_by: GroupBy
    group_function: GroupFunction | None
    key: KeyFunction | None
    retry: Retry
    lease: float
    start: bool
    seen: bool
    timeout: float | None
    cron: Cron | None = None


def group_option(group: GroupOption) -> tuple[GroupBy, GroupFunction | None]:
    if group is None:
        return GroupBy.NONE, None
    if callable(group):
        return GroupBy.CUSTOM, group
    try:
        by = GroupBy(group)
    except ValueError:
        raise ConfigError(
            f"group={group!r}: expected 'host', 'domain', None or a function"
        ) from None
    if by in (GroupBy.CUSTOM, GroupBy.NONE):
        raise ConfigError(f"group={group!r}: pass None or a function instead")
    return by, None


class Task(Generic[R]):
    """A registered task; call it like the function, or schedule it through the app."""

    def __init__(self, function: Callable[..., Any], options: TaskOptions) -> None:
        self.function = function
        self.options = options
        self.name = options.queue
        self.is_async = inspect.iscoroutinefunction(function)
        self.__doc__ = function.__doc__
        self.__name__ = getattr(function, "__name__", options.queue)
        self.queue_config = QueueConfig(
            name=options.queue,
            group_by=options.group_by,
            custom_key=options.key is not None,
            seen=options.seen,
        )

    def __call__(self, ctx: Context, element: Any) -> Any:
        return self.function(ctx, element)

    def __repr__(self) -> str:
        return f"<Task {self.name}>"

    def prepare(
        self,
        element: JSON,
        *,
        due: float,
        priority: int = 0,
        mode: Mode = Mode.OVERWRITE,
        revisit: bool = False,
    ) -> Schedule:
        """The element as the backend stores it: identity and group derived by this task."""
        return prepare(
            self.queue_config,
            element,
            due=due,
            priority=priority,
            mode=mode,
            revisit=revisit,
            key=self.options.key,
            group_function=self.options.group_function,
        )

    async def run(self, ctx: Context, element: Any) -> Any:
        if self.options.cron is not None and is_trigger(element, self.name):
            return await fire(self, self.options.cron, ctx, element)
        return await call_task_function(self.function, self.is_async, ctx, element)


#: The thread pool sync task functions run in: the worker's own, one thread per task slot, so a
#: sync task starts at once and its timeout counts from then (the loop's default pool, of
#: min(32, CPUs + 4) threads, would keep it waiting for a thread); that default elsewhere.
sync_executor: contextvars.ContextVar[Executor | None] = contextvars.ContextVar(
    "crawlq_sync_executor", default=None
)


async def call_task_function(
    function: Callable[..., Any], is_async: bool, ctx: Context, element: Any
) -> Any:
    """Runs a task's function: async on the loop with `ctx`, sync in the worker's thread pool
    with `ctx.sync`, in a copy of the task's context so its log lines carry the task's fields."""
    if is_async:
        result: Any = function(ctx, element)
        return await result
    run = contextvars.copy_context().run
    loop = asyncio.get_running_loop()
    future = loop.run_in_executor(sync_executor.get(), run, function, ctx.sync, element)
    try:
        await asyncio.wait([future])
    except asyncio.CancelledError:
        future.cancel()  # it never starts if it has not yet
        raise
    # Raised here, not thrown into the awaiting coroutines: a GeneratorExit of the function
    # would close them instead, and leave its element unrecorded.
    return future.result()


#: Whitespace and control characters, which no URL holds as such (they are escaped: %20).
_UNSAFE_IN_URL = re.compile(r"[\x00-\x20\x7f-\x9f\s]")


def check_url(url: str | None) -> None:
    """Refuses a URL with whitespace or control characters: parsers drop or keep them as they
    please, so one resource could be queued (and grouped) under several spellings."""
    if url is not None:
        found = _UNSAFE_IN_URL.search(url)
        if found:
            raise InvalidElement(
                f"URL {_shown(url)} holds {found.group()!r} at character {found.start()}"
                " (escape whitespace and control characters: %20)"
            )


def _shown(url: str) -> str:
    """A URL as error messages show it: credentials masked, length capped."""
    return shorten(redact(url))


def check_group(group: str) -> None:
    """A group returned by a task's group function: text of at most MAX_NAME characters."""
    if not isinstance(group, str):
        raise InvalidElement(f"the group function returned a {type(group).__name__}, not a str")
    problem = unicode_error(group)
    if problem or len(group) > MAX_NAME:
        raise InvalidElement(
            f"group {shorten(group)} is {problem or f'longer than {MAX_NAME} characters'}"
        )


def _key_of(key: KeyFunction, element: JSON, payload: str, queue: str) -> str:
    """The identity a task's `key=` function gives an element: a str (None, or a number,
    would make distinct elements one), checked like an element."""
    try:
        identity = key(element)
    except InvalidElement as exc:
        raise InvalidElement(exc.reason, queue=queue) from None
    except Exception as exc:
        raise _raised_by("key", exc, payload, queue) from exc
    if not isinstance(identity, str):
        returned = reprlib.repr(identity)
        if identity is not None:
            returned += f" ({type(identity).__name__})"
        raise InvalidElement(
            f"the key function returned {returned}, not a str, for element {_shown(payload)}",
            queue=queue,
        )
    return check_key(identity, queue=queue)


def _raised_by(what: str, exc: Exception, payload: str, queue: str) -> InvalidElement:
    """An exception of a task's key or group function, as the error about its element."""
    return InvalidElement(
        f"the {what} function raised {type(exc).__name__}: {exc} for element {_shown(payload)}",
        queue=queue,
    )


def prepare(
    config: QueueConfig,
    element: JSON,
    *,
    due: float,
    priority: int = 0,
    mode: Mode = Mode.OVERWRITE,
    revisit: bool = False,
    key: KeyFunction | None = None,
    group_function: GroupFunction | None = None,
) -> Schedule:
    """An element as backends take it. Priority and due time are checked once per call by
    App.prepare, the boundary where they come in."""
    payload = canonical_json(element, queue=config.name)
    if config.custom_key and key is None:
        raise ConfigError(f"queue {config.name!r} derives keys in its task's code: pass the app")
    identity = payload if key is None else _key_of(key, element, payload, config.name)
    url = element_url(element) if config.group_by in (GroupBy.HOST, GroupBy.DOMAIN) else None
    try:
        check_url(url)
        group = group_of(element, config.group_by, group_function)
        if config.group_by is GroupBy.CUSTOM:
            check_group(group)
    except InvalidElement as exc:
        reason = exc.reason if url is None else exc.reason.replace(repr(url), _shown(url))
        raise InvalidElement(reason, queue=config.name) from None
    except Exception as exc:
        if config.group_by is not GroupBy.CUSTOM:
            raise
        raise _raised_by("group", exc, payload, config.name) from exc
    return Schedule(
        queue=config.name,
        key=identity,
        payload=None if identity == payload else payload,
        group=group,
        due=due,
        priority=priority,
        mode=mode,
        revisit=revisit,
    )
