"""The `crawlq` command where it answered wrongly without a word: groups typed by hand in
another spelling than crawlq's, dead keys given as plain text, crawl options that ended in a
traceback. The real CLI in a subprocess, on a real SQLite file (tests/test_cli.py's
harness)."""

from __future__ import annotations

import asyncio
import time

import pytest

from crawlq.backends import open_backend
from crawlq.types import Limit, LimitRule

from .test_cli import APP, Cli, cli, empty, started

__all__ = ["cli", "started"]  # test_cli's fixtures, used here too

BUCHER = "xn--bcher-kva.example.test"  # bücher.example.test as hosts are grouped


# -- limits block / unblock / set / delete: the group as crawlq spells it ---------------------


def test_block_and_unblock_spell_the_host_as_groups_are_spelled(started: Cli) -> None:
    started.ok("schedule", "fetch", '"http://a.example.test/1"', '"http://bücher.example.test/1"')

    ran = started.ok("limits", "block", "A.Example.TEST.", "--for", "600")
    assert ran.out.strip() == "a.example.test blocked for 600s"
    assert ran.err == "", ran
    ran = started.ok("limits", "block", "BÜCHER.example.test", "--for", "600", "--reason", "r")
    assert ran.out.strip() == f"{BUCHER} blocked for 600s"
    assert ran.err == "", ran
    groups = started.groups()
    assert groups["a.example.test"]["block_reason"] == "blocked by hand"
    assert groups["a.example.test"]["blocked_until"] > time.time() + 300
    assert groups[BUCHER]["block_reason"] == "r"
    assert set(groups) == {"a.example.test", BUCHER}

    ran = started.ok("limits", "unblock", "Bücher.Example.Test")
    assert ran.out.strip() == f"{BUCHER} unblocked"
    assert started.groups()[BUCHER]["block_reason"] is None
    assert started.groups()["a.example.test"]["block_reason"] == "blocked by hand"


def test_block_and_unblock_warn_when_no_element_is_in_the_group(started: Cli) -> None:
    ran = started.ok("limits", "block", "nobody.example.test", "--for", "60")
    assert ran.out.strip() == "nobody.example.test blocked for 60s"
    assert ran.err.strip() == (
        "Warning: no queued or running element is in group 'nobody.example.test'"
    )
    ran = started.ok("limits", "unblock", "Nobody.Example.TEST")
    assert ran.out.strip() == "nobody.example.test unblocked"
    assert ran.err.strip() == (
        "Warning: no queued or running element is in group 'nobody.example.test'"
        " (as crawlq spells 'Nobody.Example.TEST')"
    )


def test_limits_set_and_delete_spell_a_pattern_as_groups_are_spelled(started: Cli) -> None:
    started.ok("schedule", "fetch", '"http://bücher.example.test/1"')
    ran = started.ok("limits", "set", "Bücher.Example.TEST.", "--concurrency", "1")
    assert ran.out.strip() == f"{BUCHER}: 1 at once, 0s apart"
    assert started.groups()[BUCHER]["limit"] == {"concurrency": 1, "interval": 0.0}
    ran = started.ok("limits", "set", "*.Bücher.Example.TEST", "--interval", "3")
    assert ran.out.strip() == f"*.{BUCHER}: unlimited at once, 3s apart"

    assert started.ok("limits", "delete", "bücher.example.test").out.strip() == (
        f"deleted {BUCHER}"
    )
    assert started.groups()[BUCHER]["limit"] == {"concurrency": 2, "interval": 0.0}
    started.ok("limits", "delete", "*.BÜCHER.example.test")
    assert not any("bcher" in pattern for pattern in started.limits())


def test_a_rule_stored_in_an_older_spelling_can_still_be_deleted(started: Cli) -> None:
    async def store_old_rule() -> None:
        backend = open_backend(started.url)
        await backend.open()
        try:
            await backend.set_limits([LimitRule(pattern="bücher.test", limit=Limit(interval=1))])
        finally:
            await backend.close()

    asyncio.run(store_old_rule())
    assert "bücher.test" in started.limits()
    assert started.ok("limits", "delete", "Bücher.test").out.strip() == "deleted bücher.test"
    assert "bücher.test" not in started.limits()


# -- dead requeue / purge: --text, and a clear answer when a key is not dead ------------------

X = "https://a.example.test/x"
Y = "https://a.example.test/y"


@pytest.fixture
def two_dead(started: Cli) -> Cli:
    started.ok("schedule", "explode", "--text", X, Y)
    started.ok("worker", APP, "--queue", "explode", "--burst")
    assert started.queue("explode") == empty(dead=2)
    return started


def test_dead_requeue_of_an_unquoted_url_fails_and_says_how(two_dead: Cli) -> None:
    ran = two_dead.run("dead", "requeue", "explode", X)
    assert ran.code == 1, ran
    assert ran.out.strip() == "", ran  # one Error line says it all
    [line] = ran.err.strip().splitlines()
    assert line.startswith(
        f"Error: requeued 0 of the 1 elements named; not dead in explode: {X!r}"
    ), ran
    assert "--text" in line, ran
    assert "Traceback" not in ran.err, ran
    assert two_dead.queue("explode") == empty(dead=2)

    assert two_dead.ok("dead", "requeue", "explode", "--text", X).out.strip() == "requeued 1"
    assert two_dead.queue("explode") == empty(total=1, due=1, dead=1)
    assert [d["key"] for d in two_dead.dead("explode")] == [f'"{Y}"']


def test_dead_purge_takes_text_keys_too(two_dead: Cli) -> None:
    ran = two_dead.run("dead", "purge", "explode", Y)
    assert ran.code == 1, ran
    assert ran.out.strip() == "" and ran.err.startswith("Error: purged 0 of the 1"), ran
    assert two_dead.queue("explode") == empty(dead=2)
    assert two_dead.ok("dead", "purge", "explode", "--text", Y, Y).out.strip() == "purged 1"
    assert [d["key"] for d in two_dead.dead("explode")] == [f'"{X}"']


def test_dead_requeue_names_only_the_keys_that_were_not_dead(two_dead: Cli) -> None:
    gone = "https://a.example.test/never-queued"
    ran = two_dead.run("dead", "requeue", "explode", "--text", X, gone)
    assert ran.code == 1, ran
    assert ran.out.strip() == "", ran
    [line] = ran.err.strip().splitlines()
    gone_key = f'"{gone}"'
    assert line == f"Error: requeued 1 of the 2 elements named; not dead in explode: {gone_key!r}"
    assert two_dead.queue("explode") == empty(total=1, due=1, dead=1)

    # named again, X is queued, not dead: said so, as for any key
    x_key = f'"{X}"'
    ran = two_dead.run("dead", "requeue", "explode", x_key)
    assert ran.code == 1, ran
    assert f"not dead in explode: {x_key!r}" in ran.err, ran
    assert "--text" not in ran.err, ran  # the key was JSON: no hint


# -- crawl: bad options are one line, not a traceback ------------------------------------------


@pytest.mark.parametrize(
    ("args", "named"),
    [
        (["--max-attempts", "0"], "--max-attempts must be at least 1"),
        (["--max-attempts", "-2"], "--max-attempts must be at least 1"),
        (["--retry-delay", "-1"], "--retry-delay must be between 0"),
        (["--retry-delay", "nan"], "--retry-delay must be a finite number"),
        (["--grace", "-1"], "--grace must be between 0"),
        (["--timeout", "inf"], "--timeout must be a finite number"),
    ],
)
def test_crawl_refuses_unusable_numbers_in_one_line(cli: Cli, args: list[str], named: str) -> None:
    out = cli.home / "out"
    line = cli.refused(
        "crawl", "http://a.example.test/", "--out", str(out), "--resolve-only", *args
    )
    assert line.startswith(f"Error: {named}"), line
    assert not out.exists()


def test_crawl_refuses_an_out_folder_it_cannot_make(cli: Cli) -> None:
    (cli.home / "a-file").write_text("")
    for out in (cli.home / "a-file" / "sub", cli.home / "a-file" / "sub" / "deeper"):
        line = cli.refused("crawl", "http://a.example.test/", "--out", str(out), "--resolve-only")
        assert line.startswith(f"Error: --out {str(out)!r}: cannot make the folder"), line
