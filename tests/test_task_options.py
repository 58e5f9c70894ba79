"""A task's options, checked where they come in: `key=` and `group=` functions and `Retry`."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest

from crawlq import App, ConfigError, Context, InvalidElement, Retry
from crawlq.checks import MAX_SECONDS


@pytest.fixture
def app(tmp_path: Path) -> App:
    return App(f"sqlite:///{tmp_path / 'app.db'}")


@pytest.mark.parametrize(
    ("key", "match"),
    [
        (lambda element: element.get("id"), r"key function returned None, not a str"),
        (lambda element: len(element), r"key function returned 1 \(int\), not a str"),
        (lambda element: element["id"], r"key function raised KeyError: 'id'"),
    ],
    ids=["none", "int", "raising"],
)
async def test_a_key_function_must_give_a_str_or_the_elements_are_refused(
    app: App, key: Any, match: str
) -> None:
    """`str(key(element))` made every None key "None": distinct elements became one."""

    @app.task(group=None, key=key)
    async def items(ctx: Context, element: dict[str, str]) -> None: ...

    with pytest.raises(InvalidElement, match=rf"queue 'items': the {match}") as refused:
        await app.aschedule_many(items, [{"name": "a"}, {"name": "b"}])
    (stats,) = await (await app.backend()).queue_stats(["items"])
    await app.aclose()
    assert stats.total == 0
    assert """for element '{"name":"a"}'""" in str(refused.value)
    if "raised" in match:
        assert isinstance(refused.value.__cause__, KeyError)


async def test_a_group_function_that_raises_is_refused_naming_queue_and_element(
    app: App,
) -> None:
    @app.task(group=lambda element: element["tenant"])
    async def per_tenant(ctx: Context, element: dict[str, str]) -> None: ...

    with pytest.raises(
        InvalidElement,
        match=r"""queue 'per_tenant': the group function raised KeyError: 'tenant' for element"""
        r""" '\{"name":"a"\}'""",
    ) as refused:
        await app.aschedule(per_tenant, {"name": "a"})
    (stats,) = await (await app.backend()).queue_stats(["per_tenant"])
    await app.aclose()
    assert isinstance(refused.value.__cause__, KeyError)
    assert stats.total == 0


BAD_RETRIES: list[tuple[dict[str, Any], str]] = [
    ({"cap": math.nan}, "Retry cap must be a finite number of seconds, got nan"),
    ({"cap": math.inf}, "Retry cap must be a finite number of seconds, got inf"),
    ({"base": 1e300, "cap": 1e300}, r"Retry base must be between 0 and .* \(100 years\)"),
    ({"base": -1}, "Retry base must be between 0"),
    ({"base": "1"}, "Retry base must be a finite number of seconds, got '1'"),
    ({"max_attempts": 2.5}, "Retry max_attempts must be an integer, got 2.5"),
    ({"max_attempts": True}, "Retry max_attempts must be an integer, got True"),
    ({"max_attempts": 0}, "Retry max_attempts must be at least 1, got 0"),
    ({"factor": math.nan}, "Retry factor must be a finite number at least 1, got nan"),
    ({"factor": math.inf}, "Retry factor must be a finite number at least 1, got inf"),
    ({"factor": 0.5}, "Retry factor must be a finite number at least 1, got 0.5"),
    ({"jitter": math.nan}, "Retry jitter must be a finite number between 0 and 1, got nan"),
    ({"jitter": 1.5}, "Retry jitter must be a finite number between 0 and 1, got 1.5"),
]


@pytest.mark.parametrize(
    ("options", "match"),
    BAD_RETRIES,
    ids=["-".join(f"{k}={v}" for k, v in options.items()) for options, _ in BAD_RETRIES],
)
def test_a_retry_policy_is_checked_with_errors_naming_the_setting(
    options: dict[str, Any], match: str
) -> None:
    """NaN meant no backoff at all, 1e300 seconds an element put off for ever, and an
    infinite cap an OverflowError after about 1,000 attempts."""
    with pytest.raises(ConfigError, match=match):
        Retry(**options)


@pytest.mark.parametrize("factor", [2.0, math.exp(360), 1e300])
def test_retry_delays_stay_within_100_years_at_any_attempt(factor: float) -> None:
    """Even from the tiniest base, where factor ** n overflows before reaching the cap."""
    retry = Retry(max_attempts=2**53 - 1, base=5e-324, factor=factor, cap=MAX_SECONDS, jitter=0)
    delays = [retry.delay(n) for n in (1, 2, 3, 1_000, 5_000, 10**9)]
    assert all(0 < delay <= MAX_SECONDS for delay in delays)
    assert delays == sorted(delays)
    assert delays[-1] == MAX_SECONDS
    assert Retry(base=MAX_SECONDS, cap=MAX_SECONDS, jitter=0).delay(10**9) == MAX_SECONDS
