"""What the inspection commands print of text crawled sites chose (error messages, URLs,
group names, block reasons): never rich markup, never terminal control sequences, masked as
`crawlq stats` masks it; and numbers too large for the backends refused in one line. The real
CLI in a subprocess on a real SQLite file (tests/test_cli.py's harness), filled through the
backend's own API."""

from __future__ import annotations

import asyncio
import io
import json

import click
import pytest
from click.testing import CliRunner
from rich.console import Console

from crawlq.backends import open_backend
from crawlq.cli.common import Group
from crawlq.cli.inspect import MAX_OFFSET
from crawlq.errors import BackendError
from crawlq.observe.logs import printable
from crawlq.observe.terminal import render
from crawlq.types import Failure, GroupBy, GroupStats, Limit, QueueConfig, Schedule, WorkerInfo

from .test_cli import Cli, cli

__all__ = ["cli"]  # test_cli's fixture, used here too

ESCAPES = "\x1b]8;;http://evil.test/\x1b\\click\x1b]8;;\x1b\\ \x1b[2J\x1b[31mFAKE\x1b[0m \x9b1A"
ERROR = f"RuntimeError: title was {ESCAPES}\nsecond line\r\tend"
KEY = '"http://evil.test/\x1b[2Jpage"'
MARKUP_GROUPS = ["x[/]y", "[bold red]styled[/]", "a[link=http://evil.test/]click"]
CONTROL_GROUP = "evil.test\x1b[2J\nFAKE"
REASON = "banned by http://user:s3cret@evil.test/ \x1b[2J"
WORKER = "[red]w1\x1b[2J"


def gs(name: str, *, reason: str | None = None, now: float = 0.0) -> GroupStats:
    return GroupStats(
        name=name,
        queued=1,
        running=0,
        limit=Limit(),
        next_start=None,
        blocked_until=now + 600 if reason else None,
        block_reason=reason,
    )


async def fill(url: str) -> None:
    """One dead letter with escapes in its key and error; queued elements in groups named
    with markup and control characters, one blocked for a reason holding a password; a live
    worker with markup in its id."""
    backend = open_backend(url, create=True)
    await backend.open()
    try:
        await backend.ensure_queues(
            [
                QueueConfig(name="custom", group_by=GroupBy.CUSTOM),
                QueueConfig(name="groups", group_by=GroupBy.CUSTOM),
            ]
        )
        now = backend.now()
        await backend.schedule(
            [Schedule(queue="custom", key=KEY, payload=KEY, group="evil.test", due=now)]
        )
        claimed = await backend.claim(["custom"], worker="w1", limit=1, lease=60.0)
        [element] = claimed.elements
        await backend.fail([Failure(element=element, error=ERROR, traceback="tb\x1b[2J")])
        await backend.schedule(
            [
                Schedule(queue="groups", key=f'"{i}"', payload=f'"{i}"', group=name, due=now)
                for i, name in enumerate([*MARKUP_GROUPS, CONTROL_GROUP])
            ]
        )
        await backend.block_group(CONTROL_GROUP, now + 600, REASON)
        await backend.register_worker(
            WorkerInfo(id=WORKER, host="h", pid=1, queues=("groups",), started=now, heartbeat=now)
        )
    finally:
        await backend.close()


@pytest.fixture
def filled(cli: Cli) -> Cli:
    asyncio.run(fill(cli.url))
    return cli


def assert_no_controls(text: str) -> None:
    """Nothing a terminal acts on but newlines (and the tabs of tables)."""
    assert printable(text) == text, repr(text)


# -- printable --------------------------------------------------------------------------------


def test_printable_escapes_control_characters_and_keeps_the_rest() -> None:
    assert printable("a\x1b[2Jb\x00\x7f\x9b\x07") == "a\\x1b[2Jb\\x00\\x7f\\x9b\\x07"
    assert printable("line\nnext\ttab\rback") == "line\nnext\ttab\\rback"
    assert printable("line\nnext\ttab", one_line=True) == "line\\nnext\ttab"
    assert printable("bücher.example/ü — 日本 [x]") == "bücher.example/ü — 日本 [x]"


# -- stats --watch ----------------------------------------------------------------------------


def drawn(*groups: GroupStats, workers: list[WorkerInfo] | None = None) -> str:
    """What `stats --watch` draws on a colour terminal, escape codes and all."""
    out = io.StringIO()
    console = Console(file=out, width=250, force_terminal=True, color_system="truecolor")
    console.print(render("sqlite:///x.db", [], list(groups), workers or [], 0.0, {}, 1.0))
    return out.getvalue()


def test_watch_shows_names_as_they_are_not_as_markup() -> None:
    """A group named x[/]y crashed the view (MarkupError); [bold red]... was drawn styled."""
    worker = WorkerInfo(id=WORKER, host="[i]h", pid=1, queues=("q",), started=0.0, heartbeat=0.0)
    text = drawn(*map(gs, MARKUP_GROUPS), workers=[worker])
    for name in MARKUP_GROUPS:
        assert name in text, text
    assert "[red]w1\\x1b[2J" in text, text
    assert "[i]h" in text, text


def test_watch_escapes_controls_and_masks_block_reasons_as_stats_does() -> None:
    text = drawn(gs(CONTROL_GROUP, reason=REASON))
    assert "s3cret" not in text, text
    assert "http://***@evil.test/" in text, text
    assert "evil.test\\x1b[2J\\nFAKE" in text, text
    assert "\x1b[2J" not in text, repr(text)
    assert "\nFAKE" not in text, text


def test_stats_watch_draws_stored_names_as_text(filled: Cli) -> None:
    out = filled.ok("stats", "--watch", "--count", "1", env=filled.env(COLUMNS="300")).out
    for name in MARKUP_GROUPS:
        assert name in out, out
    assert "evil.test\\x1b[2J\\nFAKE" in out, out
    assert "s3cret" not in out, out
    assert "[red]w1\\x1b[2J" in out, out
    assert_no_controls(out)


# -- plain commands ---------------------------------------------------------------------------


def test_dead_list_escapes_what_a_terminal_would_act_on(filled: Cli) -> None:
    out = filled.ok("dead", "list", "custom").out
    assert_no_controls(out)
    lines = out.splitlines()
    assert len(lines) == 3, out  # the letter, its error, the error's second line (indented)
    assert lines[0].endswith('"http://evil.test/\\x1b[2Jpage"'), out
    assert lines[1] == f"    RuntimeError: title was {printable(ESCAPES)}", out
    assert lines[2] == "    second line\\r\tend", out

    [letter] = json.loads(filled.ok("dead", "list", "custom", "--json").out)
    assert (letter["key"], letter["error"], letter["traceback"]) == (KEY, ERROR, "tb\x1b[2J")


def test_stats_escapes_names_and_reasons(filled: Cli) -> None:
    out = filled.ok("stats").out
    assert_no_controls(out)
    assert "evil.test\\x1b[2J\\nFAKE" in out, out
    assert "http://***@evil.test/ \\x1b[2J" in out, out
    assert "[red]w1\\x1b[2J" in out, out
    assert "s3cret" not in out, out


def test_error_lines_escape_what_they_quote() -> None:
    """Every crawlq error becomes one `Error:` line: text it quotes (a name, a server's
    answer) cannot drive the terminal."""

    @click.group(cls=Group)
    def tool() -> None: ...

    @tool.command()
    def fail() -> None:
        raise BackendError(f"server said {ESCAPES}\x07")

    ran = CliRunner().invoke(tool, ["fail"])
    assert ran.exit_code == 1, ran.output
    assert ran.output == f"Error: server said {printable(ESCAPES)}\\x07\n", ran.output


# -- numbers beyond 64 bits -------------------------------------------------------------------

TOO_LARGE = str(2**64 + 1)


@pytest.mark.parametrize(
    ("args", "option"),
    [
        (("dead", "list", "custom", "--offset", TOO_LARGE), "--offset"),
        (("dead", "list", "custom", "--limit", TOO_LARGE), "--limit"),
        (("stats", "--groups", TOO_LARGE), "--groups"),
        (("stats", "--watch", "--count", "1", "--groups", TOO_LARGE), "--groups"),
    ],
    ids=lambda a: " ".join(a) if isinstance(a, tuple) else a,
)
def test_numbers_beyond_the_backends_are_refused(
    filled: Cli, args: tuple[str, ...], option: str
) -> None:
    """They ended in an OverflowError traceback."""
    ran = filled.run(*args)
    assert ran.code == 2, ran
    assert "Traceback" not in ran.err, ran
    assert f"Invalid value for '{option}'" in ran.err, ran


def test_the_largest_offset_is_served(filled: Cli) -> None:
    ran = filled.ok("dead", "list", "custom", "--offset", str(MAX_OFFSET), "--limit", "1000000")
    assert ran.out.strip() == "no dead elements in custom", ran
