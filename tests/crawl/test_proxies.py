"""The turn of a fetcher's proxies, with those that could not be reached left out a while."""

from __future__ import annotations

from crawlq.crawl.proxies import PAUSE, PAUSE_CAP, Proxies


def test_proxies_take_turns_and_one_that_failed_is_left_out_for_longer_each_time() -> None:
    now = [0.0]
    proxies = Proxies(["a", "b", "c"], clock=lambda: now[0])
    assert [proxies.next() for _ in range(4)] == ["a", "b", "c", "a"]
    proxies.failed("b")
    assert [proxies.next() for _ in range(4)] == ["c", "a", "c", "a"]
    now[0] += PAUSE
    assert [proxies.next() for _ in range(3)] == ["b", "c", "a"]
    proxies.failed("b")  # twice in a row: twice as long
    now[0] += PAUSE
    assert "b" not in [proxies.next() for _ in range(4)]
    now[0] += PAUSE
    proxies.worked(proxies.next())
    proxies.worked("b")
    proxies.failed("b")  # in a row no more: the first pause again
    now[0] += PAUSE
    assert "b" in [proxies.next() for _ in range(3)]


def test_while_every_proxy_is_left_out_the_one_back_soonest_is_used() -> None:
    now = [0.0]
    proxies = Proxies(["a", "b"], clock=lambda: now[0])
    for _ in range(20):
        proxies.failed("a")
    proxies.failed("b")
    assert proxies.next() == "b"
    now[0] += PAUSE_CAP
    assert {proxies.next(), proxies.next()} == {"a", "b"}
