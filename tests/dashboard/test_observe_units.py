"""The observability pieces on their own: log fields and redaction, the log options of every
command, search globs, throttling reasons."""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Iterator

import click
import pytest
from prometheus_client.parser import text_string_to_metric_families

from crawlq.cli.main import cli
from crawlq.observe.dashboard import glob_for, sparkline
from crawlq.observe.logs import KEY_LIMIT, configure, safe_key, task_fields, task_scope
from crawlq.observe.metrics import Snapshot, exposition, throttle_reason
from crawlq.types import GroupStats, Limit


@pytest.fixture
def captured() -> Iterator[io.StringIO]:
    root = logging.getLogger()
    before, level = list(root.handlers), root.level
    stream = io.StringIO()
    configure("info", "json", stream=stream)
    try:
        yield stream
    finally:
        for handler in list(root.handlers):
            if handler not in before:
                root.removeHandler(handler)
        root.setLevel(level)


def test_lines_logged_inside_a_task_scope_carry_its_fields(captured: io.StringIO) -> None:
    log = logging.getLogger("tests.units")
    fields = task_fields(
        queue="pages", key='"http://a.test/"', attempt=2, group="a.test", worker="w1"
    )
    with task_scope(fields):
        log.info("inside %s", "the task")
    log.info("outside")
    inside, outside = (json.loads(line) for line in captured.getvalue().splitlines())
    assert inside["message"] == "inside the task"
    assert {k: inside[k] for k in ("queue", "key", "attempt", "group", "worker")} == {
        "queue": "pages",
        "key": '"http://a.test/"',
        "attempt": 2,
        "group": "a.test",
        "worker": "w1",
    }
    assert outside["message"] == "outside" and "queue" not in outside


def test_a_task_scope_masks_and_cuts_its_key_when_a_line_is_logged(
    captured: io.StringIO,
) -> None:
    key = '"https://bob:hunter2@example.org/' + "x" * 500 + '"'
    fields = task_fields(queue="pages", key=key, attempt=1, group="example.org", worker="w1")
    with task_scope(fields):
        logging.getLogger("tests.units").info("inside")
    line = json.loads(captured.getvalue())
    assert line["key"] == safe_key(key)
    assert "hunter2" not in line["key"] and len(line["key"]) == KEY_LIMIT


def test_keys_in_logs_lose_passwords_and_length() -> None:
    assert safe_key('"https://bob:hunter2@example.org/x"') == '"https://***@example.org/x"'
    assert "hunter2" not in safe_key("https://bob:hunter2@example.org/")
    assert safe_key('"http://plain.test/"') == '"http://plain.test/"'
    assert len(safe_key("x" * 1000)) == 200


def _leaves(command: click.Command) -> Iterator[click.Command]:
    if isinstance(command, click.Group):
        for sub in command.commands.values():
            yield from _leaves(sub)
    else:
        yield command


def test_every_command_takes_log_level_and_log_format() -> None:
    leaves = list(_leaves(cli))
    assert len(leaves) >= 12
    for command in leaves:
        options = {o for p in command.params for o in getattr(p, "opts", [])}
        assert {"--log-level", "--log-format"} <= options, command.name


def test_search_text_becomes_a_glob() -> None:
    assert glob_for("") == "*"
    assert glob_for(" example ") == "*example*"
    assert glob_for("*.gov") == "*.gov"
    # spelled as group names are, or a search for a host as typed would find nothing
    assert glob_for("Shop.Example.") == "*shop.example*"
    assert glob_for("Bücher.DE") == "*xn--bcher-kva.de*"
    assert glob_for("*.Bücher.de") == "*.xn--bcher-kva.de"


def test_a_search_with_more_than_one_star_before_its_end_is_refused() -> None:
    assert glob_for("*.example.*") == "*.example.*"
    assert glob_for("shop*") == "shop*"
    assert glob_for("a**b***") == "a*b*", "a run of * is one"
    assert glob_for("*?*?*?*?*?*?#") is None
    assert glob_for("*a*b") is None
    assert glob_for("a*b*c") is None


def test_sparkline_scales_into_its_box() -> None:
    assert sparkline([]) == ""
    assert sparkline([0, 5, 10], width=100, height=20) == "0.0,18.0 50.0,10.0 100.0,2.0"


def _group(**given: object) -> GroupStats:
    fields: dict[str, object] = {
        "name": "a.test",
        "queued": 3,
        "running": 0,
        "limit": Limit(concurrency=2, interval=1.0),
        "next_start": None,
        "blocked_until": None,
        "block_reason": None,
    }
    fields.update(given)
    return GroupStats(**fields)  # type: ignore[arg-type]


def test_why_a_group_waits() -> None:
    now = 1000.0
    assert throttle_reason(_group(), now) is None
    assert throttle_reason(_group(blocked_until=1010.0, block_reason="429"), now) == "blocked"
    assert throttle_reason(_group(blocked_until=990.0), now) is None
    assert throttle_reason(_group(running=2), now) == "full"
    assert throttle_reason(_group(next_start=1000.5), now) == "interval"


def test_text_logs_escape_what_would_forge_a_line_or_drive_a_terminal() -> None:
    stream = io.StringIO()
    configure("info", "text", stream=stream)
    log = logging.getLogger("crawlq.test")
    forged = "http://a.test/\n2026-11-24 04:00:00,000 INFO crawlq.worker: all 1000 pages done"
    with task_scope(task_fields(queue="q", key="k\x1b[2J", attempt=1, group="g", worker="w")):
        log.warning("page %s failed: %s", forged, "\x1b]8;;http://evil.test\x07click\x1b]8;;\x07")
        try:
            raise ValueError("bad\x1b[31m\n2026-11-24 04:00:00,000 INFO crawlq.x: forged\u2028x")
        except ValueError:
            log.exception("and then")
    lines = stream.getvalue().split("\n")[:-1]
    assert len(lines) == 7  # the warning; the error and its traceback (5 lines)
    assert lines[0].endswith("[queue=q key=k\\x1b[2J attempt=1 group=g worker=w]")
    assert "\\n2026-11-24 04:00:00,000 INFO" in lines[0]
    assert lines[-2:] == [
        "  ValueError: bad\\x1b[31m",
        "  2026-11-24 04:00:00,000 INFO crawlq.x: forged\\u2028x",
    ]
    assert all(line.startswith("  ") for line in lines[2:])  # none reads as a line of its own
    assert not any(c in stream.getvalue() for c in "\x1b\x07\u2028")


@pytest.mark.parametrize("named", [0, 3])
def test_metrics_count_groups_and_name_only_the_busiest_asked_for(named: int) -> None:
    """Every host is a group, and the busiest change: a series each would grow Prometheus
    one for every host ever among them."""
    now = 1000.0
    groups = [_group(name=f"h{n}.test", queued=100 - n, running=2) for n in range(150)]
    groups += [_group(name=f"b{n}.test", blocked_until=now + 60) for n in range(50)]
    snapshot = Snapshot(at=now, queues=[], groups=groups, workers=[])
    text = exposition(snapshot, named).decode()
    samples = [s for f in text_string_to_metric_families(text) for s in f.samples]
    labelled = {s.labels["group"] for s in samples if "group" in s.labels}
    assert labelled == {f"h{n}.test" for n in range(named)}
    counted = {s.labels["reason"]: s.value for s in samples if s.name == "crawlq_groups_throttled"}
    assert counted == {"blocked": 50, "full": 150, "interval": 0}
