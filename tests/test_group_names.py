"""A group has one spelling wherever it is written: the names a task's group function returns,
limit patterns and hosts from URLs agree (lower case, IDNA, no trailing dot), so a rule
written `Partner-A` or `bücher.test` limits the group it names, on every backend."""

from __future__ import annotations

from typing import Any

import pytest

from crawlq import App, Context
from crawlq.grouping import group_name, group_pattern, url_host
from crawlq.limits import check_pattern

from .helpers import ManualClock


@pytest.mark.parametrize(
    ("written", "spelled"),
    [
        ("Partner-A", "partner-a"),
        ("Example.COM.", "example.com"),
        ("bücher.test", "xn--bcher-kva.test"),
        ("BÜCHER.test", "xn--bcher-kva.test"),
        ("Müller GmbH", "xn--mller gmbh-9db"),
        ("bücher\u3002test", "xn--bcher-kva.test"),
        ("shard-7", "shard-7"),
        (".", "."),
    ],
)
def test_a_name_has_one_spelling(written: str, spelled: str) -> None:
    assert group_name(written) == spelled
    assert group_name(spelled) == spelled
    assert check_pattern(written) == spelled  # a rule for one name is spelled as the name


@pytest.mark.parametrize(
    "url",
    ["http://Bücher.Test./a", "http://EXAMPLE.test:8080/", "http://[::1]/", "http://0x7f.1/"],
)
def test_hosts_are_already_spelled_as_group_names(url: str) -> None:
    host = url_host(url)
    assert group_name(host) == host
    assert check_pattern(host) == host


@pytest.mark.parametrize(
    ("pattern", "spelled"),
    [
        ("*.Bücher.TEST", "*.xn--bcher-kva.test"),
        ("*.example.test.", "*.example.test"),
        ("*.", "*."),  # the dot after a wildcard is part of what it matches
        ("[AB]*.Test", "[ab]*.test"),
        ("Partner-?", "partner-?"),
    ],
)
def test_patterns_are_spelled_as_the_names_they_match(pattern: str, spelled: str) -> None:
    assert group_pattern(pattern) == spelled
    assert check_pattern(pattern) == spelled


async def _claimed_at_once(app: App, task: Any, elements: list[Any]) -> tuple[int, Any]:
    backend = await app.backend()
    await app.aschedule_many(task, elements)
    claimed = await backend.claim([task.name], worker="w", limit=10, lease=30)
    groups = await backend.group_stats(include_idle=True)
    return len(claimed.elements), groups


async def test_a_rule_limits_the_custom_group_it_names_with_capitals(url: str) -> None:
    app = App(url, clock=ManualClock())
    app.limit("Partner-A", concurrency=1)

    @app.task(group=lambda element: element["partner"])
    async def login(ctx: Context, element: Any) -> None: ...

    try:
        at_once, groups = await _claimed_at_once(
            app, login, [{"partner": "Partner-A", "n": n} for n in range(4)]
        )
        assert at_once == 1
        [group] = groups
        assert group.name == "partner-a"
        assert (group.queued, group.running, group.limit.concurrency) == (3, 1, 1)
    finally:
        await app.aclose()


async def test_a_rule_written_in_unicode_limits_its_host_and_custom_group(url: str) -> None:
    app = App(url, clock=ManualClock())
    app.limit("Bücher.TEST", concurrency=1)
    app.limit("MÜLLER", concurrency=2)

    @app.task()
    async def fetch(ctx: Context, element: str) -> None: ...

    @app.task(group=lambda element: element["partner"])
    async def login(ctx: Context, element: Any) -> None: ...

    try:
        pages = [f"http://BÜCHER.test/{n}" for n in range(4)]
        at_once, groups = await _claimed_at_once(app, fetch, pages)
        assert at_once == 1
        assert [g.name for g in groups] == ["xn--bcher-kva.test"]
        at_once, _ = await _claimed_at_once(
            app, login, [{"partner": "Müller", "n": n} for n in range(4)]
        )
        assert at_once == 2
        rules = {rule.pattern for rule in await (await app.backend()).limits()}
        assert {"xn--bcher-kva.test", "xn--mller-kva"} <= rules
    finally:
        await app.aclose()


async def test_a_group_function_that_returns_no_text_is_still_refused(url: str) -> None:
    from crawlq import InvalidElement

    app = App(url, clock=ManualClock())

    @app.task(group=lambda element: element["partner"])
    async def login(ctx: Context, element: Any) -> None: ...

    try:
        with pytest.raises(InvalidElement, match="returned a int"):
            await app.aschedule(login, {"partner": 7})
    finally:
        await app.aclose()
