"""Send slots on both backends: a request about to go out late on its reserved time takes it
over at the current time only while nobody has reserved after it, and otherwise queues
behind the latest reservation (Backend.reserve_send_slot); Politeness.pace hands the
request its slot, which it confirms right before it is written (politeness.py)."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import random
import socket
import threading
import time
from typing import Any

import pytest
from aiohttp import web

from crawlq.backends import Backend, open_backend
from crawlq.crawl.errors import Throttled
from crawlq.crawl.politeness import (
    MAX_PACING_MARGIN,
    MAX_SLOT_TRIES,
    MIN_LEAD,
    PACING_MARGIN,
    Politeness,
    Slot,
)
from crawlq.crawl.testing import Hit, Site, SyntheticWeb
from crawlq.testing.chaos import Seen, judge
from crawlq.types import Limit, LimitRule

from ..helpers import ManualClock

GAP = 0.5
URL = "http://slow.test/page/1"


def near(value: float) -> Any:
    """pytest.approx, typed Any so that tuples holding it compare under mypy --strict."""
    return pytest.approx(value)


async def test_a_late_slot_still_the_latest_is_kept_and_moves_to_now(
    backend: Backend, clock: ManualClock
) -> None:
    first, wait, _ = await backend.reserve_send_slot("slow.test", GAP)
    assert (first, wait) == (near(clock()), 0)
    mine, wait, _ = await backend.reserve_send_slot("slow.test", GAP)
    assert (mine, wait) == (near(first + GAP), near(GAP))
    clock.advance(GAP + 0.2)  # woken 0.2 s late: nobody reserved after it, so it goes now
    moved, wait, kept = await backend.reserve_send_slot("slow.test", GAP, replacing=mine)
    assert (moved, wait, kept) == (near(clock()), 0, True)
    # The next request keeps the gap from the moved time, not from the stale one.
    after, wait, _ = await backend.reserve_send_slot("slow.test", GAP)
    assert (after, wait) == (near(moved + GAP), near(GAP))
    # The plain reserve_send follows the moved time as well.
    assert await backend.reserve_send("slow.test", GAP) == near(2 * GAP)


async def test_a_kept_slot_moves_earliest_ahead_of_now(
    backend: Backend, clock: ManualClock
) -> None:
    """The lead a late request asks for: the time its write may take to follow."""
    mine, _, _ = await backend.reserve_send_slot("slow.test", GAP)
    clock.advance(0.3)
    moved, wait, kept = await backend.reserve_send_slot("slow.test", GAP, 0.01, replacing=mine)
    assert (moved, wait, kept) == (near(clock() + 0.01), near(0.01), True)


async def test_a_late_slot_someone_reserved_after_gets_a_new_one(
    backend: Backend, clock: ManualClock
) -> None:
    mine, _, _ = await backend.reserve_send_slot("slow.test", GAP)
    theirs, _, _ = await backend.reserve_send_slot("slow.test", GAP)
    clock.advance(0.3)  # late for mine, which is no longer the latest: never sent on it
    fresh, wait, kept = await backend.reserve_send_slot("slow.test", GAP, replacing=mine)
    assert (fresh, kept) == (near(theirs + GAP), False)
    assert wait == near(theirs + GAP - clock())
    # Replacing a time that was never reserved is a plain reservation too.
    other, _, kept = await backend.reserve_send_slot("slow.test", GAP, 1.0, replacing=mine + 7)
    assert (other, kept) == (near(max(fresh + GAP, clock() + 1.0)), False)


async def test_an_early_replacement_never_moves_a_slot_earlier(
    backend: Backend, clock: ManualClock
) -> None:
    """A worker whose clock runs ahead may think itself late while the backend's time has
    not reached the slot yet: the slot keeps its time and the worker waits for it."""
    await backend.reserve_send_slot("slow.test", GAP)
    mine, _, _ = await backend.reserve_send_slot("slow.test", GAP)
    kept = await backend.reserve_send_slot("slow.test", GAP, replacing=mine)
    assert kept == (near(mine), near(GAP), True)
    assert await backend.reserve_send_slot("other.test", GAP, replacing=mine) == (
        near(clock()),
        0,
        False,
    )


async def test_racing_late_requests_never_share_a_gap(backend: Backend, clock: ManualClock) -> None:
    """Many workers reserve and replace at once, each replacement from a random earlier
    answer; whatever the interleaving, the times each request finally went on (the last
    slot it got) stay a gap apart."""
    rng = random.Random(3)
    final: list[float] = []

    async def request() -> None:
        at, _, _ = await backend.reserve_send_slot("slow.test", GAP)
        for _ in range(rng.randrange(3)):
            await asyncio.sleep(0)
            clock.advance(rng.random() * GAP)
            lead = rng.choice([0.0, 0.01])
            at, _, _ = await backend.reserve_send_slot("slow.test", GAP, lead, replacing=at)
        final.append(at)

    await asyncio.gather(*(request() for _ in range(40)))
    final.sort()
    assert len(final) == 40
    assert all(b - a >= GAP - 1e-9 for a, b in itertools.pairwise(final))


# -- the worker's side: Politeness.pace hands out a slot the request confirms --------------

INTERVAL = 0.1


async def paced(backend: Backend, clock: ManualClock) -> tuple[Politeness, float, Slot]:
    """A Politeness on `backend` and `clock` with `slow.test` at INTERVAL, its gap, and the
    slot of a first request it paced."""
    rule = LimitRule(pattern="slow.test", limit=Limit(interval=INTERVAL))
    await backend.set_limits([rule])
    gap = INTERVAL + min(MAX_PACING_MARGIN, INTERVAL * PACING_MARGIN)
    politeness = Politeness(backend, clock=clock)
    slot = await politeness.pace("slow.test", URL)
    assert isinstance(slot, Slot)  # the group has an interval: a reserved slot
    return politeness, gap, slot


async def test_a_request_on_time_goes_on_its_slot(backend: Backend, clock: ManualClock) -> None:
    politeness, gap, slot = await paced(backend, clock)
    reserved = slot.at
    clock.advance(slot.tolerance / 2)  # late, but within the tolerance
    await slot.confirm()
    assert (slot.at, politeness.late_sends) == (reserved, 0)
    assert (await backend.reserve_send_slot("slow.test", gap))[0] == near(reserved + gap)


async def test_a_late_request_takes_its_slot_over_a_lead_ahead_and_goes_at_once(
    backend: Backend, clock: ManualClock
) -> None:
    politeness, gap, slot = await paced(backend, clock)
    clock.advance(0.04)  # the event loop was busy, a connection had to be made...
    await slot.confirm()  # returns without waiting for the lead: it is past its old time
    assert slot.at == near(clock() + MIN_LEAD)  # the backend answered at once
    assert politeness.late_sends == 1
    assert politeness.latest_send == near(0.04)
    # The next request counts from the new time, which this one's write is not later than.
    assert (await backend.reserve_send_slot("slow.test", gap))[0] == near(slot.at + gap)


async def test_a_late_request_another_reserved_after_waits_for_a_new_slot(
    backend: Backend, clock: ManualClock
) -> None:
    politeness, gap, slot = await paced(backend, clock)
    theirs, _, _ = await backend.reserve_send_slot("slow.test", gap)  # another worker, on time
    clock.advance(0.04)
    await slot.confirm()  # sleeps (really) for the new slot; the manual clock stays
    assert slot.at == near(theirs + gap)
    assert politeness.late_sends == 1


async def test_a_second_request_on_one_slot_reserves_its_own(
    backend: Backend, clock: ManualClock
) -> None:
    """A robots.txt redirect, or aiohttp sending again on a fresh connection."""
    _, gap, slot = await paced(backend, clock)
    first = slot.at
    await slot.confirm()
    clock.advance(gap)  # the first hop's answer took a gap: the second may go at once
    await slot.confirm()
    assert slot.at == near(first + gap)


async def test_a_request_late_at_every_try_is_put_back_not_sent(
    backend: Backend, clock: ManualClock
) -> None:
    politeness, _, slot = await paced(backend, clock)

    def dragging() -> float:  # every look at the clock finds it a second later
        clock.advance(1.0)
        return clock()

    politeness.clock = dragging
    with pytest.raises(Throttled, match="late for its slot after"):
        await slot.confirm()
    assert (politeness.late_sends, politeness.put_back) == (MAX_SLOT_TRIES, 1)


async def test_two_requests_of_a_group_both_woken_late_do_not_leapfrog_forever(url: str) -> None:
    """Two requests of a group at once, on the real clock, with the short interval whose
    tolerance (half a millisecond) is below the event loop's timer step. When each slept for
    its wait after the backend's answer, each woke late at every try, and each fresh slot it
    took was passed by the other's: 1 to 15 of 300 requests went, the rest were put back.
    Now each wakes on its due time: they go."""
    backends = [open_backend(url) for _ in range(2)]
    for opened in backends:
        await opened.open()
    try:
        await backends[0].set_limits([LimitRule(pattern="slow.test", limit=Limit(interval=0.1))])
        workers = [Politeness(opened) for opened in backends]

        async def requests(politeness: Politeness, count: int) -> None:
            for _ in range(count):
                slot = await politeness.pace("slow.test", URL)
                with contextlib.suppress(Throttled):
                    await slot.confirm()

        await asyncio.gather(*(requests(politeness, 30) for politeness in workers))
        put_back = sum(politeness.put_back for politeness in workers)
        assert put_back <= 6, f"{put_back} of 60 requests put back"
    finally:
        for opened in backends:
            await opened.close()


# -- the judge's clock: a request is stamped when its bytes reach the server's host ------


async def test_a_request_is_stamped_when_it_arrives_not_when_the_server_gets_to_it() -> None:
    """The server's loop is held up by one request's handler while another request arrives
    on a new connection: its stamp is the kernel's receive time, before the loop could even
    accept the connection, so a busy server cannot make two requests look closer."""
    entered, released = threading.Event(), threading.Event()
    times: dict[str, float] = {}

    async def hold_the_loop(request: web.Request) -> web.StreamResponse:
        entered.set()
        released.wait(60)  # blocks the server's event loop on purpose, until released
        return web.Response(text="held")

    def client(address: str, port: int) -> None:
        head = "HTTP/1.1\r\nHost: a.test\r\nConnection: close\r\n\r\n"
        with socket.create_connection((address, port), timeout=60) as first:
            first.sendall(f"GET /hold {head}".encode())
            try:
                assert entered.wait(60)
                with socket.create_connection((address, port), timeout=60) as second:
                    times["sent"] = time.time()
                    second.sendall(f"GET /page/1 {head}".encode())
                    times["released"] = time.time()
                    released.set()
                    assert second.recv(100).startswith(b"HTTP/1.1 200")
            finally:
                released.set()
            assert first.recv(100).startswith(b"HTTP/1.1 200")

    site = Site(name="a.test", pages=3, routes={"/hold": hold_the_loop})
    async with SyntheticWeb([site]) as net:
        thread = threading.Thread(
            target=client, args=(net.addresses["a.test"], net.ports["a.test"])
        )
        thread.start()
        await asyncio.to_thread(thread.join, 120)
    (late,) = [hit for hit in net.hits if hit.path == "/page/1"]
    assert times["sent"] <= late.at < times["released"]


def test_the_judge_names_the_requests_each_violation_involves() -> None:
    def hit(path: str, at: float, ended: float | None, port: int) -> Hit:
        return Hit(host="a.test", method="GET", path=path, at=at, ended=ended,
                   peer="127.0.0.1", port=port, headers={}, cookies={})  # fmt: skip

    hits = [
        hit("/robots.txt", 100.0, 100.05, 5001),
        hit("/page/0", 100.2, 100.6, 5001),
        hit("/page/1", 100.25, 100.3, 5002),  # while /page/0 is open, 50 ms after it
        hit("/page/2", 101.0, 101.1, 5003),
    ]
    workers = {("127.0.0.1", 5001): 11, ("127.0.0.1", 5002): 22}
    expected = {("a.test", f"/page/{n}") for n in range(3)}
    verdict = judge(hits, expected, concurrency=1, interval=0.1, workers=workers)
    assert (verdict.count("concurrency"), verdict.count("interval")) == (1, 1)
    (overlap,) = [v for v in verdict.violations if v.kind == "concurrency"]
    assert overlap.request is not None
    assert (overlap.request.path, overlap.request.worker) == ("/page/1", 22)
    assert [(s.path, s.at, s.ended, s.worker) for s in overlap.overlapping] == [
        ("/page/0", 100.2, 100.6, 11)
    ]
    assert verdict.explain("concurrency") == [
        "concurrency at a.test: /page/1 [arrived 0.2500, answered 0.3000, pid 22] while open:"
        " /page/0 [arrived 0.2000, answered 0.6000, pid 11] (1 requests still open)"
    ]
    (short,) = verdict.explain("interval")
    assert short.startswith("interval at a.test: /page/1 [arrived 0.2500")
    assert "too soon after: /page/0 [arrived 0.2000" in short
    # A connection nobody saw the owner of: named by its address.
    assert "[arrived 1.0000, answered 1.1000, from 127.0.0.1]" in Seen.of(
        hits[3], workers
    ).describe(verdict.started)
