"""GroupCommit: the items waiting when its thread comes round go to `apply` together."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Sequence

import pytest

from crawlq.groupcommit import GroupCommit

DEADLINE = 30.0


class Recorder:
    """`apply` that records its batches; "bad" items fail alone, "all-bad" the whole batch."""

    def __init__(self) -> None:
        self.batches: list[list[str]] = []

    def __call__(self, items: list[str]) -> Sequence[str | BaseException]:
        self.batches.append(items)
        if "all-bad" in items:
            raise OSError("disk full")
        return [ValueError(item) if item == "bad" else item.upper() for item in items]


async def hold(commit: GroupCommit[str, str]) -> threading.Event:
    """Keeps the commit's thread busy until the returned event is set."""
    started, release = threading.Event(), threading.Event()

    def busy() -> None:
        started.set()
        release.wait(DEADLINE)

    asyncio.get_running_loop().create_task(commit.run(busy))
    assert await asyncio.to_thread(started.wait, DEADLINE)
    return release


async def test_the_calls_waiting_go_to_apply_as_one_batch_each_with_its_outcome() -> None:
    recorder = Recorder()
    commit = GroupCommit(recorder, "test-commit")
    try:
        release = await hold(commit)
        calls = [asyncio.ensure_future(commit(item)) for item in ("a", "bad", "b")]
        await asyncio.sleep(0)  # each call has queued its item
        release.set()
        outcomes = await asyncio.wait_for(asyncio.gather(*calls, return_exceptions=True), DEADLINE)
    finally:
        await commit.close()
    assert recorder.batches == [["a", "bad", "b"]]
    assert outcomes[0] == "A" and outcomes[2] == "B"
    assert isinstance(outcomes[1], ValueError)


async def test_a_batch_whose_apply_raises_fails_every_call_in_it_and_no_other() -> None:
    recorder = Recorder()
    commit = GroupCommit(recorder, "test-commit")
    try:
        release = await hold(commit)
        calls = [asyncio.ensure_future(commit(item)) for item in ("a", "all-bad")]
        await asyncio.sleep(0)
        release.set()
        failed = await asyncio.wait_for(asyncio.gather(*calls, return_exceptions=True), DEADLINE)
        after = await asyncio.wait_for(commit("c"), DEADLINE)
    finally:
        await commit.close()
    assert [type(outcome) for outcome in failed] == [OSError, OSError]
    assert after == "C"


async def test_a_call_cancelled_before_its_turn_is_left_out() -> None:
    recorder = Recorder()
    commit = GroupCommit(recorder, "test-commit")
    try:
        release = await hold(commit)
        dropped, kept = asyncio.ensure_future(commit("x")), asyncio.ensure_future(commit("y"))
        await asyncio.sleep(0)
        dropped.cancel()
        release.set()
        assert await asyncio.wait_for(kept, DEADLINE) == "Y"
    finally:
        await commit.close()
    assert recorder.batches == [["y"]]
    with pytest.raises(asyncio.CancelledError):
        await dropped


async def test_after_close_the_next_call_starts_the_thread_again() -> None:
    recorder = Recorder()
    commit = GroupCommit(recorder, "test-commit")
    closed: list[str] = []
    assert await commit("a") == "A"
    await commit.close(lambda: closed.append("files"))
    await commit.close(lambda: closed.append("again"))  # closed already: nothing to do
    assert await commit("b") == "B"
    await commit.close()
    assert closed == ["files"]
    assert recorder.batches == [["a"], ["b"]]
