"""Retry-After as the server wrote it: delay-seconds, or an HTTP-date in any of the three
forms RFC 9110 says a recipient must accept, all of them GMT."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from crawlq.crawl.politeness import MAX_RETRY_AFTER, retry_after

NOW = 1_795_000_000.0  # 2026-11-18T...Z, a whole second


@pytest.fixture(params=["UTC", "Europe/Berlin", "America/Los_Angeles"])
def local_zone(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    monkeypatch.setenv("TZ", request.param)
    time.tzset()
    yield request.param
    monkeypatch.undo()
    time.tzset()


@pytest.mark.parametrize(
    "form", ["%a, %d %b %Y %H:%M:%S GMT", "%A, %d-%b-%y %H:%M:%S GMT", "%a %b %d %H:%M:%S %Y"]
)
def test_an_http_date_in_each_form_means_the_same_moment_in_any_local_zone(
    local_zone: str, form: str
) -> None:
    due = NOW + 600
    written = time.strftime(form, time.gmtime(due))
    assert retry_after(written, NOW) == due


def test_a_minus_zero_zone_is_gmt_too() -> None:
    written = time.strftime("%a, %d %b %Y %H:%M:%S -0000", time.gmtime(NOW + 30))
    assert retry_after(written, NOW) == NOW + 30


@pytest.mark.parametrize(
    ("value", "expected"),
    [("120", NOW + 120), (" 5 ", NOW + 5), ("99999999", NOW + MAX_RETRY_AFTER)],
)
def test_delay_seconds(value: str, expected: float) -> None:
    assert retry_after(value, NOW) == expected


@pytest.mark.parametrize("value", ["", "soon", "-5", "1.5", "²", "١٢", "Mon, 99 Foo 2026"])
def test_what_is_neither_is_unusable(value: str) -> None:
    """Unicode digits pass `str.isdigit` but not `float`: they raised ValueError, which
    turned the 429 into a network error and left the host unpaused."""
    assert retry_after(value, NOW) is None
