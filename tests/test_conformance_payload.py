"""SPEC 3.2 with payloads: a schedule that comes while its element runs is remembered whole,
payload included, and the element runs with it after the running one ends, however that run
ends (ack, retry, a failure that would kill it, lease expiry, release); as re-scheduling a
queued element replaces its payload. Only a task with a custom key can give one key two
payloads. Against every backend (conftest.BACKENDS), as test_conformance.py."""

from __future__ import annotations

import json

from crawlq.backends import Backend
from crawlq.tasks import prepare
from crawlq.types import JSON, Claimed, Failure, GroupBy, Mode, QueueConfig, ScheduleResult

from .helpers import ManualClock, claim

KEYED = QueueConfig(name="keyed", group_by=GroupBy.NONE, custom_key=True)


def fixed_key(element: JSON) -> str:
    """Every element is one element, "k"; the key is the JSON text of the element "k", so
    the element "k" itself is stored as its own key (no payload of its own)."""
    return '"k"'


async def schedule(
    backend: Backend,
    element: JSON,
    *,
    seconds: float = 0,
    priority: int = 0,
    mode: Mode = Mode.OVERWRITE,
) -> ScheduleResult:
    await backend.ensure_queues([KEYED])
    item = prepare(
        KEYED, element, due=backend.now() + seconds, priority=priority, mode=mode, key=fixed_key
    )
    return await backend.schedule([item])


async def claim_one(backend: Backend, lease: float = 3600) -> Claimed:
    (claimed,) = await claim(backend, "keyed", lease=lease)
    return claimed


async def running_v1_then_v2(backend: Backend, seconds: float = 0) -> Claimed:
    """{"v": 1} running, {"v": 2} scheduled meanwhile (due in `seconds`)."""
    await schedule(backend, {"v": 1})
    running = await claim_one(backend)
    assert json.loads(running.payload) == {"v": 1}
    result = await schedule(backend, {"v": 2}, seconds=seconds, priority=3)
    assert result.deferred == 1
    info = await backend.element("keyed", '"k"')
    assert info is not None and json.loads(info.payload) == {"v": 1}  # the run's, until it ends
    return running


async def test_after_an_ack_the_schedule_remembered_runs_with_its_payload(
    backend: Backend,
) -> None:
    running = await running_v1_then_v2(backend)
    await backend.ack([running])
    again = await claim_one(backend)
    assert (json.loads(again.payload), again.priority, again.attempt) == ({"v": 2}, 3, 1)
    await backend.ack([again])
    assert await claim(backend, "keyed") == []  # once, not twice


async def test_a_retry_runs_the_schedule_remembered_with_its_payload(
    backend: Backend, clock: ManualClock
) -> None:
    running = await running_v1_then_v2(backend, seconds=5)
    await backend.fail([Failure(element=running, error="boom", retry_at=clock() + 60)])
    assert await claim(backend, "keyed") == []
    clock.advance(5)  # the remembered time wins over the retry's, as it always did
    again = await claim_one(backend)
    assert (json.loads(again.payload), again.attempt) == ({"v": 2}, 1)


async def test_a_failure_that_would_kill_it_runs_the_schedule_remembered_instead(
    backend: Backend,
) -> None:
    running = await running_v1_then_v2(backend)
    await backend.fail([Failure(element=running, error="gave up")])
    again = await claim_one(backend)
    assert json.loads(again.payload) == {"v": 2}
    assert await backend.dead_letters("keyed") == []


async def test_after_its_lease_expires_the_schedule_remembered_runs_with_its_payload(
    backend: Backend, clock: ManualClock
) -> None:
    await schedule(backend, {"v": 1})
    running = await claim_one(backend, lease=10)
    await schedule(backend, {"v": 2})
    clock.advance(11)
    again = await claim_one(backend)
    assert (json.loads(again.payload), again.attempt) == ({"v": 2}, 1)
    await backend.ack([running])  # too late: the run it belonged to is over
    info = await backend.element("keyed", '"k"')
    assert info is not None and (info.state, json.loads(info.payload)) == ("running", {"v": 2})


async def test_a_release_queues_the_schedule_remembered_with_its_payload(
    backend: Backend,
) -> None:
    running = await running_v1_then_v2(backend)
    await backend.release([running])
    again = await claim_one(backend)
    assert json.loads(again.payload) == {"v": 2}


async def test_only_if_new_on_a_running_element_remembers_nothing(backend: Backend) -> None:
    await schedule(backend, {"v": 1})
    running = await claim_one(backend)
    kept = await schedule(backend, {"v": 2}, mode=Mode.ONLY_IF_NEW)
    assert (kept.kept, kept.deferred) == (1, 0)
    await backend.ack([running])
    assert await claim(backend, "keyed") == []
    assert await backend.element("keyed", '"k"') is None


async def test_only_if_new_keeps_a_schedule_remembered_and_its_payload(backend: Backend) -> None:
    running = await running_v1_then_v2(backend)
    kept = await schedule(backend, {"v": 3}, mode=Mode.ONLY_IF_NEW)
    assert kept.kept == 1
    await backend.ack([running])
    assert json.loads((await claim_one(backend)).payload) == {"v": 2}


async def test_only_if_earlier_takes_the_payload_of_the_schedule_it_takes(
    backend: Backend, clock: ManualClock
) -> None:
    running = await running_v1_then_v2(backend, seconds=30)
    later = await schedule(backend, {"v": 3}, seconds=60, mode=Mode.ONLY_IF_EARLIER)
    assert later.kept == 1
    await backend.ack([running])
    clock.advance(30)
    again = await claim_one(backend)
    assert json.loads(again.payload) == {"v": 2}
    earlier = await schedule(backend, {"v": 4}, seconds=10, mode=Mode.ONLY_IF_EARLIER)
    assert earlier.deferred == 1
    await backend.ack([again])
    clock.advance(10)
    assert json.loads((await claim_one(backend)).payload) == {"v": 4}


async def test_the_last_schedule_remembered_wins_even_when_it_is_the_running_payload(
    backend: Backend,
) -> None:
    running = await running_v1_then_v2(backend)
    await schedule(backend, {"v": 1})
    await backend.ack([running])
    assert json.loads((await claim_one(backend)).payload) == {"v": 1}


async def test_a_payload_that_is_its_key_is_remembered_too(backend: Backend) -> None:
    """The element "k" is stored as its key, with no payload of its own: remembered while
    {"v": 1} runs, it must still replace that payload, and the other way round."""
    await schedule(backend, {"v": 1})
    running = await claim_one(backend)
    await schedule(backend, "k")
    await backend.ack([running])
    again = await claim_one(backend)
    assert json.loads(again.payload) == "k"
    await schedule(backend, {"v": 5})
    await backend.ack([again])
    assert json.loads((await claim_one(backend)).payload) == {"v": 5}
