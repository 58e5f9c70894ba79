"""Cron schedules for starting tasks: `@app.task(cron="0 2 * * *")` runs a job every night.

The queue does the bookkeeping, so any number of workers on any number of machines fire
each occurrence once, with nothing else running. Each cron task's queue holds one *trigger*
element (`trigger`), due at the next occurrence; being unique, it is one whatever number of
workers plant it (each does as it starts and every REPLANT_EVERY, `Mode.ONLY_IF_NEW`: one an
operator moved, to skip a night, stays where it was put). The trigger names its expression
and zone, so a changed schedule plants a trigger of its own at once; the old one, when it
comes due, runs nothing.
When the trigger runs, it schedules in one step the occurrence's own element (its time, as
text: "2026-11-25T02:00:00Z", which the task's function receives) and the next trigger (the
queue remembers a schedule made while its element runs, and applies it however the run
ends): the chain never breaks, and a failing occurrence retries and dead-letters on its own,
as any element does. An occurrence missed while no worker ran is run once when one comes
back, with the time it was due.

Expressions are the five fields of Vixie cron (minute, hour, day of month, month, day of
week: `*`, `5`, `1-5`, `*/15`, `1-30/2`, lists, JAN-DEC and SUN-SAT, 7 for Sunday too; a
day matches either day field when both are restricted) or @yearly, @monthly, @weekly,
@daily and @hourly, in UTC or the IANA zone `tz`. A time a DST change skips fires as the
same wall time on the old offset (an hour late); a time it repeats fires once.
"""

from __future__ import annotations

import calendar
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from .errors import ConfigError
from .observe.logs import logger
from .types import JSON, Mode

if TYPE_CHECKING:
    from .backends import Backend
    from .context import Context
    from .tasks import Task

log = logger(__name__)
#: The field naming the task in a cron trigger element (beside its expression and zone).
TRIGGER = "crawlq.cron"
#: Seconds between a running worker's plantings of its cron triggers: one lost (dead-lettered
#: after its backend failed in the middle of its run, or lost with a Redis that kept no
#: copy) is back by then.
REPLANT_EVERY = 300.0
#: An expression matching no time in this many years is refused (`0 0 30 2 *`).
HORIZON_YEARS = 8

_MACROS = {
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
    "@monthly": "0 0 1 * *",
    "@weekly": "0 0 * * 0",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@hourly": "0 * * * *",
}
_MONTHS = {name: n for n, name in enumerate(calendar.month_abbr) if name}
_DAYS = {name: n for n, name in enumerate(("SUN", "MON", "TUE", "WED", "THU", "FRI", "SAT"))}
_FIELDS: tuple[tuple[str, int, int, dict[str, int]], ...] = (  # name, lowest, highest, names
    ("minute", 0, 59, {}),
    ("hour", 0, 23, {}),
    ("day of month", 1, 31, {}),
    ("month", 1, 12, {k.upper(): v for k, v in _MONTHS.items()}),
    ("day of week", 0, 7, _DAYS),
)


@dataclass(frozen=True, slots=True)
class Cron:
    """A parsed cron expression in a time zone."""

    expression: str
    tz: str
    minutes: frozenset[int]
    hours: frozenset[int]
    days: frozenset[int]
    months: frozenset[int]
    weekdays: frozenset[int]  # 0 Sunday ... 6 Saturday
    either_day: bool  # both day fields restricted: a day matches either

    @classmethod
    def parse(cls, expression: str, tz: str = "UTC") -> Cron:
        if not isinstance(expression, str):
            raise ConfigError(f"cron must be text such as '0 2 * * *', got {expression!r}")
        fields = _MACROS.get(expression.strip().lower(), expression).split()
        if len(fields) != 5:
            raise ConfigError(
                f"cron {expression!r}: expected 5 fields (minute hour day-of-month month"
                " day-of-week) or @daily, @hourly, @weekly, @monthly, @yearly"
            )
        try:
            ZoneInfo(tz)
        except (ZoneInfoNotFoundError, ValueError, TypeError):
            raise ConfigError(f"cron tz {tz!r} is not an IANA time zone name") from None
        values = [
            _field(text, *spec, expression) for text, spec in zip(fields, _FIELDS, strict=True)
        ]
        weekdays = frozenset(day % 7 for day in values[4])
        cron = cls(
            expression=expression,
            tz=tz,
            minutes=values[0],
            hours=values[1],
            days=values[2],
            months=values[3],
            weekdays=weekdays,
            either_day=not fields[2].startswith("*") and not fields[4].startswith("*"),
        )
        cron.next_after(datetime.now(UTC).timestamp())  # refuses one that never matches
        return cron

    def _day_matches(self, day: datetime) -> bool:
        in_month = day.day in self.days
        in_week = (day.weekday() + 1) % 7 in self.weekdays
        return (in_month or in_week) if self.either_day else (in_month and in_week)

    def next_after(self, moment: float) -> float:
        """The first time after `moment` (seconds since the epoch) the expression matches."""
        zone = ZoneInfo(self.tz)
        wall = datetime.fromtimestamp(moment, zone).replace(tzinfo=None)
        wall = wall.replace(second=0, microsecond=0) + timedelta(minutes=1)
        last_year = wall.year + HORIZON_YEARS
        while wall.year <= last_year:
            if wall.month not in self.months:
                wall = (wall.replace(day=1) + timedelta(days=32)).replace(day=1, hour=0, minute=0)
            elif not self._day_matches(wall):
                wall = wall.replace(hour=0, minute=0) + timedelta(days=1)
            elif wall.hour not in self.hours:
                wall = wall.replace(minute=0) + timedelta(hours=1)
            elif wall.minute not in self.minutes:
                wall += timedelta(minutes=1)
            else:
                at = wall.replace(tzinfo=zone).timestamp()
                if at > moment:  # an hour a DST change repeats comes round once
                    return at
                wall += timedelta(minutes=1)
        raise ConfigError(f"cron {self.expression!r} matches no time in {HORIZON_YEARS} years")


def _field(
    text: str, name: str, low: int, high: int, names: dict[str, int], whole: str
) -> frozenset[int]:
    """The values one field allows."""
    found: set[int] = set()
    for part in text.split(","):
        span, _, step_text = part.partition("/")
        step = _number(step_text, name, whole, {}) if step_text else 1
        if step < 1:
            raise ConfigError(f"cron {whole!r}: a step of the {name} field must be at least 1")
        if span == "*":
            first, last = low, high
        elif "-" in span:
            start, _, end = span.partition("-")
            first, last = _number(start, name, whole, names), _number(end, name, whole, names)
        else:
            first = _number(span, name, whole, names)
            last = high if step_text else first  # Vixie: "5/15" is "5-59/15"
        if not low <= first <= last <= high:
            raise ConfigError(
                f"cron {whole!r}: the {name} field takes {low} to {high}, low to high, got {part!r}"
            )
        found.update(range(first, last + 1, step))
    return frozenset(found)


def _number(text: str, name: str, whole: str, names: dict[str, int]) -> int:
    value = names.get(text.upper())
    if value is not None:
        return value
    if not text.isdigit():
        raise ConfigError(f"cron {whole!r}: {text!r} is no value of the {name} field")
    return int(text)


def occurrence_text(moment: float) -> str:
    """An occurrence as the element a cron task receives: UTC, to the minute, as cron's
    times are (a trigger moved by hand to a few seconds past one still names that minute)."""
    return datetime.fromtimestamp(moment, UTC).strftime("%Y-%m-%dT%H:%M:00Z")


def trigger(task_name: str, cron: Cron) -> JSON:
    """The element that fires a cron task's occurrences (one per queue and schedule: it is
    unique)."""
    return {TRIGGER: task_name, "cron": cron.expression, "tz": cron.tz}


def is_trigger(element: object, task_name: str) -> bool:
    """A trigger of this task: of its schedule now, or of one it had (which runs nothing)."""
    return isinstance(element, dict) and element.get(TRIGGER) == task_name


async def plant(tasks: Iterable[Task[Any]], backend: Backend) -> None:
    """Each cron task's trigger, due at its next occurrence, unless it is queued already
    (due sooner for a missed occurrence, or later where an operator moved it): what a worker
    of their queues does as it starts."""
    now = backend.now()
    items = [
        task.prepare(trigger(task.name, cron), due=cron.next_after(now), mode=Mode.ONLY_IF_NEW)
        for task in tasks
        if (cron := task.options.cron) is not None
    ]
    if items:
        await backend.schedule(items)


async def fire(task: Task[Any], cron: Cron, ctx: Context, element: JSON) -> None:
    """A trigger's run: the occurrence it was due for and the next trigger (which the queue
    remembers while this one runs), in one atomic schedule. A crash before it runs the trigger
    again; after it, its lease's end requeues the trigger at the next occurrence (with its ack,
    the occurrence would have been lost then), so each occurrence is scheduled once. The
    trigger of a schedule the task no longer has ends there: its ack removes it."""
    if element != trigger(task.name, cron):
        log.info("%s: the trigger of an earlier schedule %s runs nothing", task.name, element)
        return
    now = ctx.backend.now()
    occurrence = task.prepare(occurrence_text(ctx.due), due=now, mode=Mode.ONLY_IF_NEW)
    following = task.prepare(trigger(task.name, cron), due=cron.next_after(max(now, ctx.due)))
    await ctx.backend.schedule([occurrence, following])
