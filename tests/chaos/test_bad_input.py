"""Bad input, generated: property-based tests (hypothesis) of scheduling and of the `crawlq`
command on SQLite and Redis.

What is thrown at them: arbitrary JSON (unicode with NUL, U+2028 and lone surrogates, ints far
beyond 64 bits, NaN and infinities, dicts with non-string keys, nesting 150 deep), elements of
up to 2 MB, bytes that are not UTF-8 (as Python hands them over: lone surrogates), hostile URLs
(schemes other than http(s), credentials, IDNs, 10 KB, whitespace and control characters, bad
ports), bad queue names, priorities, delays and limit patterns.

The properties, checked after every example:

- nothing raises anything but a crawlq error (ConfigError, InvalidElement, UnknownQueue) whose
  message names the problem; the CLI prints one `Error:` line and exits non-zero, never a
  traceback;
- what the test's own model of the rules (identity.py, checks.py) says is valid is accepted,
  and it round-trips exactly: a claim returns the same JSON, priority and due time;
- the store stays consistent: Backend.check() (`crawlq check`) finds nothing wrong.

Hypothesis is derandomized and keeps no example database, so CI runs the same examples every
time; deadlines are off (a loaded CI machine is slow, not wrong).
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import socket
import subprocess
import sys
import urllib.parse
from collections.abc import Coroutine, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest
from click.testing import CliRunner, Result
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from hypothesis.control import currently_in_test_context

from crawlq import App
from crawlq.backends import Backend
from crawlq.checks import EXACT_INT, MAX_NAME, MAX_SECONDS
from crawlq.cli.main import cli
from crawlq.errors import ConfigError, CrawlqError, InvalidElement, UnknownQueue
from crawlq.grouping import bounded_glob, group_name
from crawlq.identity import MAX_DEPTH, MAX_ELEMENT_BYTES, canonical_json
from crawlq.limits import check_pattern
from crawlq.portal import Portal
from crawlq.types import Claimed, LimitRule

from ..helpers import START

T = TypeVar("T")

#: CI-sized: every property of this file on both backends runs in well under a minute.
EXAMPLES = 100
FEW = 40
PROPERTY = settings(
    max_examples=EXAMPLES,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[
        HealthCheck.function_scoped_fixture,
        HealthCheck.too_slow,
        HealthCheck.data_too_large,
        HealthCheck.large_base_example,
    ],
)
FEWER = settings(PROPERTY, max_examples=FEW)

# -- strategies -------------------------------------------------------------------------------

#: Any code point, lone surrogates included, with the troublesome ones made likely.
CHARS = st.one_of(
    st.characters(exclude_categories=()),
    st.sampled_from(["\x00", "\u2028", "\ud800", "\udcff", "\x7f", "\n", "é", "💥", '"', "\\"]),
)
TEXT = st.text(CHARS, max_size=20)
SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.integers(min_value=-(2**200), max_value=2**200),
    st.floats(),  # NaN and infinities included
    TEXT,
)
JSONISH = st.recursive(
    SCALARS,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4),
        st.dictionaries(st.one_of(TEXT, TEXT, st.integers(0, 9)), inner, max_size=4),
    ),
    max_leaves=12,
)


def nested(depth: int) -> Any:
    value: Any = "deep"
    for level in range(depth):
        value = [value] if level % 2 else {"k": value}
    return value


DEEP = st.integers(min_value=MAX_DEPTH - 3, max_value=MAX_DEPTH + 50).map(nested)
HUGE = st.one_of(
    st.integers(MAX_ELEMENT_BYTES - 100, MAX_ELEMENT_BYTES + 100).map(lambda n: "x" * n),
    st.integers(MAX_ELEMENT_BYTES // 2 - 50, MAX_ELEMENT_BYTES // 2 + 50).map(lambda n: "é" * n),
    st.sampled_from([2 * 1024 * 1024, 8 * 1024 * 1024]).map(lambda n: {"blob": "b" * n}),
    st.just(list(range(200_000))),
)
ELEMENTS = st.one_of(JSONISH, JSONISH, JSONISH, DEEP, HUGE)

SCHEMES = ["http", "https", "HTTP", "hTtPs", "ftp", "javascript", "file", "data", "mailto", ""]
HOSTS = [
    "example.test",
    "WWW.Example.TEST",
    "example.test.",
    "bücher.example",
    "xn--bcher-kva.example",
    "127.0.0.1",
    "[::1]",
    "[::1",
    "",
    "exa mple.test",
    "exa\tmple.test",
    "a" * 300 + ".test",
    "münchen.例え.jp",
]


def mostly(common: list[str], rare: list[str]) -> st.SearchStrategy[str]:
    """One of `common` three times in four, else one of `rare`."""
    return st.one_of(*[st.sampled_from(common)] * 3, st.sampled_from(rare))


URLS = st.builds(
    lambda scheme, sep, user, host, port, path: f"{scheme}{sep}{user}{host}{port}{path}",
    mostly(["http", "https", "HTTP", "hTtPs"], SCHEMES),
    mostly(["://"], [":", ":///", " ://"]),
    mostly(["", "user:s3cret@", ":s3cret@", "token@"], ["a@b@", "u:p:q@"]),
    mostly(HOSTS[:7], HOSTS),
    mostly(["", ":8080", ":0"], [":99999", ":abc", ":"]),
    st.one_of(
        st.just("/"),
        st.text(st.characters(codec="utf-8", min_codepoint=0x21), max_size=30).map("/".__add__),
        st.text(CHARS, max_size=30).map("/".__add__),
        st.integers(9_000, 11_000).map(lambda n: "/" + "p" * n),
        st.sampled_from(["/a b", "/a\x00b", "/\r\nx", "?q=1#f", "/%00", " ", "/\u00a0"]),
    ),
)
NUMBERS = st.one_of(
    st.integers(-(10**6), 10**6),
    st.floats(-1e6, 1e6),
    st.floats(),
    st.integers(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.sampled_from([MAX_SECONDS, -MAX_SECONDS, EXACT_INT, -EXACT_INT, EXACT_INT + 1, 1e300]),
    st.booleans(),
)
#: Numbers as typed on a command line, and text that is no number.
OPTION_TEXT = st.one_of(NUMBERS.map(str), NUMBERS.map(str), TEXT)
NAMES = st.one_of(
    st.text(CHARS, max_size=12),
    st.sampled_from(["jobs", "*.example.test", "a?c", "[ab]*.test", "x.test", "Ünïcode.test"]),
    st.sampled_from(["jobs", " jobs", "jobs ", "", "a:b", "{x}", "q\x00", "*", "x" * MAX_NAME]),
    st.sampled_from(["x" * (MAX_NAME + 1), "\ud800", "tab\tname", "é" * 100]),
)

# -- the model: what the rules say, written independently of the code ---------------------------


def element_problems(value: Any, depth: int = 1) -> set[str]:
    """Words the refusal of `value` must contain (one of them), or nothing if it is valid."""
    problems: set[str] = set()
    if depth > MAX_DEPTH and isinstance(value, (list, tuple, dict)):
        return {"nested"}  # containers count; a scalar inside the deepest one does not
    if isinstance(value, float) and not math.isfinite(value):
        problems.add("NaN")
    elif isinstance(value, str):
        try:
            value.encode()
        except UnicodeEncodeError:
            problems.add("surrogate")
    elif isinstance(value, int) and not isinstance(value, bool) and len(str(abs(value))) > 4300:
        problems.add("digits")
    elif isinstance(value, list):
        for item in value:
            problems |= element_problems(item, depth + 1)
    elif isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(key, str):
                problems.add("not a string")
            else:
                problems |= element_problems(key, depth + 1)
            problems |= element_problems(item, depth + 1)
    return problems


def too_large(value: Any) -> bool:
    text = json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return len(text.encode()) > MAX_ELEMENT_BYTES


def name_ok(name: str) -> bool:
    try:
        name.encode()
    except UnicodeEncodeError:
        return False
    return 0 < len(name) <= MAX_NAME and name.isprintable() and name == name.strip()


def seconds_ok(value: Any, *, negative: bool = True) -> bool:
    return (
        isinstance(value, int | float)
        and not isinstance(value, bool)
        and math.isfinite(value)
        and (-MAX_SECONDS if negative else 0) <= value <= MAX_SECONDS
    )


def integer_ok(value: Any, low: int = -EXACT_INT) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and low <= value <= EXACT_INT


def same_json(a: Any, b: Any) -> bool:
    """Equal as JSON, types included (True is not 1, 1.0 is not 1)."""
    return bool(canonical_json(a) == canonical_json(b) and a == b)


def clear_message(exc: BaseException, *words: str) -> None:
    """A crawlq error on one line that names the problem: one of `words`."""
    message = str(exc)
    assert isinstance(exc, CrawlqError), f"{type(exc).__name__}: {message}"
    assert "\n" not in message and len(message) < 2000, message
    assert not words or any(word.lower() in message.lower() for word in words), (words, message)


# -- one app over a real backend, driven from this thread --------------------------------------


class Harness:
    """The app `tests` schedule through, its backend, and a portal to run both from sync code;
    a fixed clock, so due times are exact."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.portal = Portal()
        self.app = App(url, clock=lambda: START)
        self.app.limit("*", concurrency=None)

        @self.app.task(group=None)
        async def jobs(ctx: Any, element: Any) -> None: ...

        @self.app.task
        async def pages(ctx: Any, element: Any) -> None: ...

        @self.app.task(group="domain")
        async def domains(ctx: Any, element: Any) -> None: ...

        @self.app.task(group=None, key=lambda element: str(element) * 2)
        async def keyed(ctx: Any, element: Any) -> None: ...

        @self.app.task(
            group=lambda element: element.get("g") if isinstance(element, dict) else None
        )
        async def grouped(ctx: Any, element: Any) -> None: ...

        self.backend: Backend = self.run(self.app.backend())

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        return self.portal.call(coro)

    def schedule(self, queue: str, element: Any, **options: Any) -> None:
        self.run(self.app.aschedule(queue, element, **options))

    def take(self, queue: str) -> list[Claimed]:
        """Claims every due element of `queue` and finishes it."""
        taken: list[Claimed] = []
        while True:
            result = self.run(self.backend.claim([queue], worker="t", limit=100, lease=600))
            if not result.elements:
                return taken
            self.run(self.backend.ack(result.elements))
            taken += result.elements

    def consistent(self) -> None:
        assert self.run(self.backend.check()) == []

    def close(self) -> None:
        try:
            self.run(self.app.aclose())
        finally:
            self.portal.close()


@pytest.fixture
def harness(url: str) -> Iterator[Harness]:
    made = Harness(url)
    try:
        yield made
        made.consistent()
    finally:
        made.close()


# -- scheduling from Python ---------------------------------------------------------------------


@PROPERTY
@given(element=ELEMENTS)
def test_any_element_is_refused_clearly_or_round_trips_exactly(
    harness: Harness, element: Any
) -> None:
    problems = element_problems(element)
    expected_ok = not problems and not too_large(element)
    try:
        harness.schedule("jobs", element)
    except CrawlqError as exc:
        assert not expected_ok, f"refused a valid element: {exc}"
        assert isinstance(exc, InvalidElement)
        clear_message(exc, "jobs", *problems, "bytes", "values")
        harness.consistent()
        event("refused")
        return
    assert expected_ok, f"accepted an element with {problems or 'too many bytes'}"
    event("accepted")
    (claimed,) = harness.take("jobs")
    assert same_json(json.loads(claimed.payload), element)
    assert claimed.key == canonical_json(element)
    harness.consistent()


@FEWER
@given(element=JSONISH)
def test_a_derived_key_is_checked_like_an_element(harness: Harness, element: Any) -> None:
    try:
        key = str(element) * 2
        key_ok = len(key.encode()) <= MAX_ELEMENT_BYTES
    except UnicodeEncodeError:
        key_ok = False
    expected_ok = not element_problems(element) and not too_large(element) and key_ok
    try:
        harness.schedule("keyed", element)
    except InvalidElement as exc:
        assert not expected_ok, exc
        clear_message(exc, "keyed")
        event("refused")
        return
    assert expected_ok
    event("accepted")
    (claimed,) = harness.take("keyed")
    assert claimed.key == str(element) * 2
    assert same_json(json.loads(claimed.payload), element)
    harness.consistent()


@FEWER
@given(group=st.one_of(TEXT, st.integers(), st.just("g" * (MAX_NAME + 1)), st.just("h.test")))
def test_a_group_function_returning_junk_is_refused(harness: Harness, group: Any) -> None:
    # Names are spelled one way (lower case, IDNA) before they are checked.
    name = group_name(group) if isinstance(group, str) and group else group
    valid = not group or (isinstance(name, str) and len(name) <= MAX_NAME)
    valid = valid and not element_problems({"g": group}) and not element_problems({"g": name})
    try:
        harness.schedule("grouped", {"g": group})
    except InvalidElement as exc:
        assert not valid, exc
        clear_message(exc, "group", "surrogate")
        event("refused")
        return
    assert valid, repr(group)
    event("accepted")
    (claimed,) = harness.take("grouped")
    assert claimed.group == (name or "")
    harness.consistent()


def url_host(url: str) -> str | None:
    """The group a queue grouped by host must give `url`, if it takes it."""
    scheme, sep, rest = url.partition("://")
    if not sep or scheme.lower() not in ("http", "https"):
        return None
    authority = rest.split("/", 1)[0].split("?", 1)[0].split("#", 1)[0]
    host = authority.rpartition("@")[2]
    if host.startswith("["):
        return host.partition("]")[0][1:].lower() if "]" in host else None
    host = host.rpartition(":")[0] if ":" in host else host
    # one spelling per host: no trailing dot, escapes decoded, IDNA, dotted-decimal IPv4
    host = urllib.parse.unquote(host).rstrip(".")
    if not host.isascii():
        host = host.encode("idna").decode("ascii")
    if host[-1:].isdigit():
        with contextlib.suppress(OSError):
            host = socket.inet_ntoa(socket.inet_aton(host))
    return host.lower()


@PROPERTY
@given(url=URLS)
def test_hostile_urls_are_refused_or_grouped_by_their_host(harness: Harness, url: str) -> None:
    for queue in ("pages", "domains"):
        try:
            harness.schedule(queue, url)
        except InvalidElement as exc:
            clear_message(exc, "URL", "surrogate", "bytes")
            event(f"{queue}: refused")
            continue
        event(f"{queue}: accepted")
        assert url.split(":", 1)[0].lower() in ("http", "https"), url
        assert not any(ch.isspace() or ord(ch) < 32 or 0x7F <= ord(ch) <= 0x9F for ch in url)
        (claimed,) = harness.take(queue)
        assert json.loads(claimed.payload) == url
        host = url_host(url)
        assert host, url
        if queue == "pages":
            assert claimed.group == host, (url, claimed.group)
        else:
            assert claimed.group, url
            assert host.rstrip(".").endswith(claimed.group.rstrip(".")), claimed.group
    harness.consistent()


@PROPERTY
@given(seconds=NUMBERS, priority=NUMBERS)
def test_delays_and_priorities_are_refused_clearly_or_stored_exactly(
    harness: Harness, seconds: Any, priority: Any
) -> None:
    expected_ok = seconds_ok(seconds) and integer_ok(priority)
    try:
        harness.schedule("jobs", "timed", seconds=seconds, priority=priority)
    except ConfigError as exc:
        assert not expected_ok, exc
        clear_message(exc, "seconds" if not seconds_ok(seconds) else "priority")
        harness.consistent()
        event("refused")
        return
    assert expected_ok, (seconds, priority)
    event("accepted")
    found = harness.run(harness.backend.element("jobs", '"timed"'))
    assert found is not None
    assert found.due == START + float(seconds)
    assert found.priority == priority
    if seconds <= 0:
        (claimed,) = harness.take("jobs")
        assert claimed.priority == priority and claimed.due == START + float(seconds)
    else:
        harness.run(harness.app.aschedule("jobs", "timed", seconds=0))
        harness.take("jobs")
    harness.consistent()


@FEWER
@given(name=NAMES)
def test_bad_queue_names_are_refused(harness: Harness, name: str) -> None:
    app = App(harness.url, clock=lambda: START)
    try:
        task = app.task(queue=name, group=None)(lambda ctx, element: None)
    except ConfigError as exc:
        assert not name_ok(name), exc
        clear_message(exc, "queue name")
        event("refused")
        return
    assert name_ok(name), repr(name)
    event("accepted")
    harness.run(app.publish(harness.backend))
    harness.run(app.aschedule(task, 1, backend=harness.backend))
    (claimed,) = harness.take(name)
    assert claimed.queue == name
    try:
        harness.schedule(name + "\udcff", 1)
    except ConfigError as exc:
        clear_message(exc, "queue name")
    harness.consistent()


@FEWER
@given(
    pattern=NAMES,
    concurrency=st.one_of(st.none(), st.integers(1, 100), NUMBERS),
    interval=st.one_of(st.floats(0, 60), NUMBERS),
)
def test_bad_limits_are_refused_or_stored_exactly(
    harness: Harness, pattern: str, concurrency: Any, interval: Any
) -> None:
    app = App(harness.url)
    expected_ok = (
        name_ok(pattern)
        and bounded_glob(pattern) is not None  # at most one * before its end
        and (concurrency is None or integer_ok(concurrency, low=1))
        and seconds_ok(interval, negative=False)
    )
    try:
        app.limit(pattern, concurrency=concurrency, interval=interval)
    except ConfigError as exc:
        assert not expected_ok, exc
        clear_message(exc, "limit", "pattern")
        event("refused")
        return
    assert expected_ok, (pattern, concurrency, interval)
    event("accepted")
    harness.run(app.publish(harness.backend))
    rules = {r.pattern: r for r in harness.run(harness.backend.limits())}
    spelled = check_pattern(pattern)  # as the group names it matches are spelled
    stored = rules[spelled]
    assert stored.limit.concurrency == concurrency
    assert stored.limit.interval == float(interval)
    if spelled != "*":
        assert harness.run(harness.backend.delete_limit(spelled))
    harness.consistent()


# -- the command line -----------------------------------------------------------------------


#: The app `crawlq start` loads from this module; each test points it at its backend.
start_app = App("sqlite:///never-opened.db")


@start_app.task(start=True)
async def begin(ctx: Any, element: Any) -> None: ...


class Cli:
    def __init__(self, harness: Harness) -> None:
        self.harness = harness
        self.runner = CliRunner()
        start_app.url = harness.url

    def invoke(self, *args: str, input: bytes | None = None) -> Result:
        """Runs `crawlq ARGS`: it exits 0, or 1 with one `Error:` line, or 2 (usage)."""
        result = self.runner.invoke(
            cli, list(args), env={"CRAWLQ_BACKEND": self.harness.url}, input=input
        )
        if result.exception is not None and not isinstance(result.exception, SystemExit):
            raise AssertionError(f"crawlq {args!r} crashed") from result.exception
        assert result.exit_code in (0, 1, 2), result.output
        if result.exit_code == 1:
            assert result.output.startswith("Error: "), result.output
            assert result.output.count("\n") == 1, result.output
        assert "Traceback" not in result.output
        if currently_in_test_context():
            event(f"crawlq {args[0]}: exit {result.exit_code}")
        return result

    def consistent(self) -> None:
        """`crawlq check` finds every invariant of the store intact."""
        result = self.invoke("check")
        assert result.exit_code == 0 and result.output.endswith(": consistent\n"), result.output


@pytest.fixture
def crawlq_cli(harness: Harness) -> Iterator[Cli]:
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    try:
        yield Cli(harness)
    finally:
        for handler in list(root.handlers):
            if handler not in handlers:
                root.removeHandler(handler)
        root.setLevel(level)


def as_argument(value: Any) -> str:
    """`value` as a person might type it: JSON (ASCII or not), or any text at all."""
    if isinstance(value, str):
        return value
    return json.dumps(value, ensure_ascii=bool(hash(str(value)) % 2))


def expected_from_text(text: str) -> tuple[bool, Any]:
    """Whether `crawlq schedule` must take `text`, and the element it then holds."""
    try:
        text.encode()
        value = json.loads(text)
    except (ValueError, RecursionError):
        return False, None
    return not element_problems(value) and not too_large(value), value


@PROPERTY
@given(raw=st.one_of(ELEMENTS.map(as_argument), TEXT, st.just("[" * 5000)))
def test_crawlq_schedule_takes_valid_json_and_refuses_the_rest_in_one_line(
    crawlq_cli: Cli, raw: str
) -> None:
    result = crawlq_cli.invoke("schedule", "--", "jobs", raw)
    expected_ok, value = expected_from_text(raw)
    assert (result.exit_code == 0) == expected_ok, result.output
    if expected_ok:
        (claimed,) = crawlq_cli.harness.take("jobs")
        assert same_json(json.loads(claimed.payload), value)
    crawlq_cli.consistent()


@FEWER
@given(delay=OPTION_TEXT, priority=OPTION_TEXT)
def test_crawlq_schedule_options_are_checked(crawlq_cli: Cli, delay: str, priority: str) -> None:
    result = crawlq_cli.invoke(
        "schedule", "--delay", delay, "--priority", priority, "--", "jobs", "1"
    )
    if result.exit_code == 0:
        found = crawlq_cli.harness.run(crawlq_cli.harness.backend.element("jobs", "1"))
        assert found is not None and found.priority == int(priority)
        assert seconds_ok(float(delay))
        crawlq_cli.harness.run(crawlq_cli.harness.app.aschedule("jobs", 1))
        crawlq_cli.harness.take("jobs")
    crawlq_cli.consistent()


@FEWER
@given(
    lines=st.lists(st.one_of(JSONISH.map(as_argument), JSONISH.map(as_argument), TEXT), max_size=5),
    noise=st.binary(max_size=8),
)
def test_crawlq_schedule_file_takes_utf8_lines_only(
    crawlq_cli: Cli, lines: list[str], noise: bytes
) -> None:
    body = "\n".join(lines).encode("utf-8", "surrogateescape") + noise
    try:
        text = body.decode("utf-8-sig")
    except UnicodeDecodeError:
        text = None
    result = crawlq_cli.invoke("schedule", "--file", "-", "jobs", input=body)
    if text is not None:
        wanted = [line.removesuffix("\r") for line in text.split("\n")]
        wanted = [line for line in wanted if line.strip()]
        verdicts = [expected_from_text(line) for line in wanted]
        expected_ok = bool(wanted) and all(ok for ok, _ in verdicts)
    else:
        expected_ok = False
        assert "not UTF-8" in result.output or result.exit_code == 2, result.output
    assert (result.exit_code == 0) == expected_ok, result.output
    if expected_ok:
        taken = crawlq_cli.harness.take("jobs")
        values = {canonical_json(value) for _, value in verdicts}
        assert {c.key for c in taken} == values
    crawlq_cli.consistent()


@FEWER
@given(raw=st.one_of(JSONISH.map(as_argument), TEXT))
def test_crawlq_start_takes_any_valid_element(crawlq_cli: Cli, raw: str) -> None:
    result = crawlq_cli.invoke("start", f"{__name__}:start_app", "--element", raw)
    expected_ok, value = expected_from_text(raw)
    assert (result.exit_code == 0) == expected_ok, result.output
    if expected_ok:
        (claimed,) = crawlq_cli.harness.take("begin")
        assert same_json(json.loads(claimed.payload), value)
    crawlq_cli.consistent()


@FEWER
@given(
    command=st.sampled_from(["list", "requeue", "purge"]),
    queue=NAMES,
    keys=st.lists(st.one_of(TEXT, JSONISH.map(as_argument), st.just("[" * 3000)), max_size=3),
)
def test_crawlq_dead_refuses_bad_names_and_keys_in_one_line(
    crawlq_cli: Cli, command: str, queue: str, keys: list[str]
) -> None:
    result = crawlq_cli.invoke("dead", command, "--", queue, *keys)
    if result.exit_code == 0:
        assert name_ok(queue)
    crawlq_cli.consistent()


@FEWER
@given(
    pattern=NAMES,
    concurrency=OPTION_TEXT,
    interval=OPTION_TEXT,
    block=OPTION_TEXT,
)
def test_crawlq_limits_refuse_bad_patterns_and_numbers_in_one_line(
    crawlq_cli: Cli, pattern: str, concurrency: str, interval: str, block: str
) -> None:
    result = crawlq_cli.invoke(
        "limits", "set", "--concurrency", concurrency, "--interval", interval, "--", pattern
    )
    if result.exit_code == 0:
        rules: dict[str, LimitRule] = {
            r.pattern: r for r in crawlq_cli.harness.run(crawlq_cli.harness.backend.limits())
        }
        assert rules[check_pattern(pattern)].limit.concurrency == int(concurrency)
        crawlq_cli.invoke("limits", "delete", "--", pattern)
    crawlq_cli.invoke("limits", "block", "--for", block, "--", pattern)
    crawlq_cli.invoke("limits", "unblock", "--", pattern)
    crawlq_cli.consistent()


@FEWER
@given(
    groups=OPTION_TEXT,
    url=st.one_of(
        URLS,
        st.sampled_from(
            [
                "redis://:s3cret@127.0.0.1:1/0",
                "rediss://user:s3cret@[::1/0",
                "redis://:s3cret@host:99999/0",
                "sqlite:///no/such/folder/s3cret.db",
                "sqlite:///tmp/a\x00s3cret.db",
                "postgres://u:s3cret@h/db",
                "redis://:s3cret\udcff@h/0",
            ]
        ),
    ),
)
def test_crawlq_stats_survives_any_backend_url_and_never_shows_a_password(
    crawlq_cli: Cli, groups: str, url: str
) -> None:
    result = crawlq_cli.invoke("stats", "--groups", groups, "--backend", url)
    secret = "s3cret" in url and "s3cret" not in url.rpartition("@")[2]
    if secret:
        assert "s3cret" not in result.output, result.output
    ours = crawlq_cli.invoke("stats", "--json", "--groups", groups)
    if ours.exit_code == 0:
        assert json.loads(ours.output)["queues"]


# -- bytes that are not UTF-8, in a real command line ------------------------------------------


def test_arguments_that_are_not_utf8_are_refused_in_one_line(tmp_path: Path) -> None:
    env = {"CRAWLQ_BACKEND": f"sqlite:///{tmp_path / 'q.db'}", "PATH": "/usr/bin:/bin"}
    for args in ([b"schedule", b"jobs", b'"\xff\xfe"'], [b"dead", b"list", b"q\xc3"]):
        ran = subprocess.run(
            [sys.executable, "-m", "crawlq", *args],
            env=env,
            capture_output=True,
            timeout=60,
            check=False,
        )
        err = ran.stderr.decode("utf-8", "replace")
        assert ran.returncode == 1, err
        assert err.count("\n") == 1 and err.startswith("Error: argument"), err
        assert "not valid Unicode" in err and "UTF-8" in err, err


def test_an_element_file_that_is_not_utf8_is_refused_naming_the_line(
    crawlq_cli: Cli, tmp_path: Path
) -> None:
    path = tmp_path / "elements.jsonl"
    path.write_bytes(b'"ok"\n"\xc3\x28"\n')
    result = crawlq_cli.invoke("schedule", "--file", str(path), "jobs")
    assert result.exit_code == 1
    assert f"--file {path}: line 2 is not UTF-8" in result.output, result.output
    assert crawlq_cli.harness.take("jobs") == [], "nothing of a refused file is queued"


def test_a_line_separator_inside_json_does_not_split_an_element(crawlq_cli: Cli) -> None:
    body = '{"text": "one\u2028two\u0085three"}\r\n"second"\n'.encode()
    result = crawlq_cli.invoke("schedule", "--file", "-", "jobs", input=body)
    assert result.exit_code == 0, result.output
    keys = {c.key for c in crawlq_cli.harness.take("jobs")}
    assert keys == {'{"text":"one\u2028two\u0085three"}', '"second"'}


def test_sync_api_refuses_deep_and_huge_elements_without_a_traceback(harness: Harness) -> None:
    for element, word in [(nested(100_000), "nested"), ("x" * (8 << 20), "bytes")]:
        with pytest.raises(InvalidElement, match=word):
            harness.schedule("jobs", element)
    with pytest.raises(UnknownQueue):
        harness.schedule("nosuch", 1)
    harness.consistent()


@pytest.mark.parametrize(
    ("options", "named"),
    [
        (["--host", "127.0.0\x00.1"], "--host"),
        (["--host", ""], "--host"),
        (["--port", "99999"], "--port"),
        (["--cache", "nan"], "--cache"),
        (["--cache", "-1"], "--cache"),
    ],
    ids=["host-nul", "host-empty", "port-out-of-range", "cache-nan", "cache-negative"],
)
def test_crawlq_dashboard_refuses_bad_options_in_one_line(
    crawlq_cli: Cli, options: list[str], named: str
) -> None:
    result = crawlq_cli.invoke("dashboard", "--port", "0", *options)
    assert result.exit_code in (1, 2) and named in result.output, result.output
