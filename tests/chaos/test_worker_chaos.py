"""Worker chaos: late acknowledgements from a worker whose lease expired (the SIGSTOP case),
then real `crawlq crawl` processes SIGKILLed, replaced and SIGSTOPped mid-crawl."""

from __future__ import annotations

from crawlq.backends import Backend
from crawlq.types import Failure

from ..helpers import ManualClock, claim, schedule

LEASE = 10.0


async def test_a_late_ack_after_the_attempts_started_afresh_is_refused(
    backend: Backend, clock: ManualClock
) -> None:
    """Run 1 stalls past its lease; run 2 is scheduled again while it runs, which starts the
    attempts afresh; run 3 (attempt 1 again) is running when run 1's ack arrives. That ack
    is stale: it must neither finish the element nor free run 3's group slot."""
    await schedule(backend, "pages", ["http://a.test/x"])
    (stalled,) = await claim(backend, lease=LEASE)
    clock.advance(LEASE + 1)
    (second,) = await claim(backend, lease=LEASE)
    assert second.attempt == stalled.attempt + 1
    await schedule(backend, "pages", ["http://a.test/x"])  # while it runs: deferred
    await backend.ack([second])
    clock.advance(1)
    (third,) = await claim(backend, lease=LEASE)
    assert third.attempt == stalled.attempt  # the attempts started afresh

    await backend.ack([stalled])  # the stalled worker wakes up
    await backend.fail([Failure(element=stalled, error="late", traceback="", retry_at=None)])

    info = await backend.element("pages", third.key)
    assert info is not None and info.state == "running"
    (group,) = await backend.group_stats("a.test")
    assert group.running == 1
    assert await backend.dead_letters("pages") == []
    await backend.ack([third])
    assert await backend.element("pages", third.key) is None


async def test_a_late_ack_never_finishes_a_new_element_in_a_reused_slot(
    backend: Backend, clock: ManualClock
) -> None:
    """The stalled run's element finishes elsewhere and a new element is added after it
    (SQLite may give it the same row id); the stalled run's ack must not finish it."""
    await schedule(backend, "pages", ["http://a.test/old"])
    (stalled,) = await claim(backend, lease=LEASE)
    clock.advance(LEASE + 1)
    (rerun,) = await claim(backend, lease=LEASE)
    await backend.ack([rerun])
    clock.advance(1)
    await schedule(backend, "pages", ["http://a.test/new"])
    (fresh,) = await claim(backend, lease=LEASE)
    await backend.ack([stalled])
    info = await backend.element("pages", fresh.key)
    assert info is not None and info.state == "running"
    await backend.ack([fresh])


async def test_a_late_ack_still_finishes_an_element_nobody_ran_again(
    backend: Backend, clock: ManualClock
) -> None:
    await schedule(backend, "pages", ["http://a.test/x"])
    (stalled,) = await claim(backend, lease=LEASE)
    clock.advance(LEASE + 1)
    await backend.ack([stalled])
    assert await backend.element("pages", stalled.key) is None
    assert await claim(backend) == []
