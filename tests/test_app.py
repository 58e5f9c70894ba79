"""The task API end to end in one process: App, @app.task, contexts, retries, the worker."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path
from typing import Any

import pytest

import crawlq
from crawlq import App, ConfigError, Context, InvalidElement, Retry, SyncContext, UnknownQueue

FAST_RETRY = Retry(max_attempts=3, base=0.01, factor=1, jitter=0)


@pytest.fixture
def app(tmp_path: Path) -> App:
    return App(f"sqlite:///{tmp_path / 'app.db'}")


async def run_burst(app: App, **options: Any) -> crawlq.worker.WorkerStats:
    return await crawlq.Worker(app, burst=True, burst_horizon=5, **options).run()


async def test_tasks_asking_for_the_backend_at_once_share_one(app: App) -> None:
    """A crawl's seeding and its progress display both ask first: two backends on one file
    fought over its write lock ("database is locked"), and one was never closed."""
    try:
        backends = await asyncio.gather(*(app.backend() for _ in range(5)))
    finally:
        await app.aclose()
    assert len({id(backend) for backend in backends}) == 1


async def test_async_and_sync_tasks_schedule_follow_ups(app: App) -> None:
    seen: list[tuple[str, Any, str]] = []

    @app.task(group=None)
    async def first(ctx: Context, n: int) -> None:
        seen.append(("first", n, threading.current_thread().name))
        await ctx.schedule(second, {"from": n})

    @app.task(group=None)
    def second(ctx: SyncContext, element: dict[str, int]) -> None:
        seen.append(("second", element, threading.current_thread().name))
        ctx.schedule("third", element["from"] * 10)

    @app.task(group=None)
    async def third(ctx: Context, n: int) -> None:
        seen.append(("third", n, threading.current_thread().name))

    await app.aschedule_many(first, [1, 2])
    stats = await run_burst(app)
    await app.aclose()
    assert stats.done == 6
    assert sorted((name, str(value)) for name, value, _ in seen) == [
        ("first", "1"),
        ("first", "2"),
        ("second", "{'from': 1}"),
        ("second", "{'from': 2}"),
        ("third", "10"),
        ("third", "20"),
    ]
    main = threading.current_thread().name
    assert {thread for name, _, thread in seen if name == "second"} != {main}
    assert {thread for name, _, thread in seen if name != "second"} == {main}


async def test_failures_retry_with_backoff_then_die_with_the_traceback(app: App) -> None:
    attempts: list[int] = []

    @app.task(group=None, retry=FAST_RETRY)
    async def flaky(ctx: Context, n: int) -> None:
        attempts.append(ctx.attempt)
        raise ValueError(f"broken {n}")

    await app.aschedule(flaky, 7)
    stats = await run_burst(app)
    backend = await app.backend()
    (letter,) = await backend.dead_letters("flaky")
    await app.aclose()
    assert attempts == [1, 2, 3]
    assert (stats.failed, stats.dead) == (3, 1)
    assert (letter.attempts, letter.error) == (3, "ValueError: broken 7")
    assert "raise ValueError" in letter.traceback


async def test_a_permanent_failure_is_dead_lettered_at_once(app: App) -> None:
    attempts: list[int] = []

    @app.task(group=None, retry=FAST_RETRY)
    async def gone(ctx: Context, n: int) -> None:
        attempts.append(ctx.attempt)
        raise crawlq.Permanent(f"404 for page {n}")

    await app.aschedule(gone, 3)
    stats = await run_burst(app)
    (letter,) = await (await app.backend()).dead_letters("gone")
    await app.aclose()
    assert attempts == [1]
    assert (stats.failed, stats.dead) == (1, 1)
    assert (letter.attempts, letter.error) == (1, "Permanent: 404 for page 3")


async def test_an_element_back_past_its_last_attempt_is_dead_with_the_reason(app: App) -> None:
    """Its last attempt's worker was lost (the lease expired), or max_attempts was lowered
    since: it is dead-lettered without running, and the letter says why."""
    ran: list[int] = []

    @app.task(group=None, max_attempts=1, lease=0.01)
    async def once(ctx: Context, n: int) -> None:
        ran.append(ctx.attempt)

    await app.aschedule(once, 1)
    backend = await app.backend()
    await backend.claim(["once"], worker="lost", limit=1, lease=0.01)  # and never settled
    await asyncio.sleep(0.05)  # past that lease: the next claim takes the element back
    stats = await run_burst(app)
    (letter,) = await backend.dead_letters("once")
    await app.aclose()
    assert ran == []
    assert stats.dead == 1
    assert letter.error is not None and "attempt 2 is past the task's max_attempts (1)" in (
        letter.error
    )


async def test_a_task_that_recovers_is_done(app: App) -> None:
    @app.task(group=None, retry=FAST_RETRY)
    async def recovers(ctx: Context, n: int) -> None:
        if ctx.attempt < 2:
            raise ConnectionError("reset")

    await app.aschedule(recovers, 1)
    stats = await run_burst(app)
    (queue,) = await (await app.backend()).queue_stats(["recovers"])
    await app.aclose()
    assert (stats.done, stats.failed, queue.total, queue.dead) == (1, 1, 0, 0)


def test_retry_delays_grow_to_their_cap_and_stay_there_at_any_attempt() -> None:
    retry = Retry(max_attempts=5000, base=1, factor=2, cap=600, jitter=0)
    assert [retry.delay(n) for n in (1, 2, 3, 10, 11)] == [1, 2, 4, 512, 600]
    assert retry.delay(1100) == retry.delay(10**9) == 600  # 2.0 ** 1099 would overflow
    assert Retry(base=0, jitter=0).delay(10**9) == 0
    assert Retry(base=3, factor=1, jitter=0).delay(10**9) == 3


async def test_a_crawlq_error_around_a_task_fails_the_attempt_instead_of_stranding_it(
    app: App, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Outside the task's own try (its log fields here), a crawlq bug once left the element
    leased: back after every lease, failing the same way, never dead. Now it is an attempt
    that failed, retried per the policy, with the error logged."""
    fields = crawlq.observe.logs.task_fields
    calls: list[int] = []

    def broken_once(**options: Any) -> Any:
        calls.append(options["attempt"])
        if len(calls) == 1:
            raise RuntimeError("log fields broke")
        return fields(**options)

    monkeypatch.setattr("crawlq.worker.runner.task_fields", broken_once)
    runs: list[int] = []

    @app.task(group=None, retry=FAST_RETRY, lease=600)
    async def page(ctx: Context, n: int) -> None:
        runs.append(ctx.attempt)

    await app.aschedule(page, 1)
    stats = await run_burst(app)
    (queue,) = await (await app.backend()).queue_stats(["page"])
    await app.aclose()
    assert calls == [1, 2]
    assert runs == [2]
    assert (stats.failed, stats.done, queue.total, queue.dead) == (1, 1, 0, 0)
    assert "crawlq failed around page" in caplog.text
    assert "RuntimeError: log fields broke" in caplog.text


async def test_task_timeout_counts_as_a_failure(app: App) -> None:
    @app.task(group=None, timeout=0.05, max_attempts=1)
    async def slow(ctx: Context, n: int) -> None:
        await asyncio.sleep(30)

    await app.aschedule(slow, 1)
    await run_burst(app)
    (letter,) = await (await app.backend()).dead_letters("slow")
    await app.aclose()
    assert letter.error == "timed out after 0.05s"


async def test_a_key_function_gives_the_identity(app: App) -> None:
    ran: list[Any] = []

    @app.task(group=None, key=lambda element: str(element["id"]))
    async def by_id(ctx: Context, element: dict[str, Any]) -> None:
        ran.append(element)

    await app.aschedule(by_id, {"id": 1, "version": "old"}, seconds=60)
    result = await app.aschedule(by_id, {"id": 1, "version": "new"})
    await run_burst(app)
    await app.aclose()
    assert result.moved == 1
    assert ran == [{"id": 1, "version": "new"}]


async def test_a_group_function_and_domain_groups(app: App) -> None:
    @app.task(group=lambda element: element["tenant"])
    async def per_tenant(ctx: Context, element: dict[str, str]) -> None: ...

    @app.task(group="domain")
    async def per_domain(ctx: Context, url: str) -> None: ...

    app.limit("acme", concurrency=1)
    await app.aschedule_many(per_tenant, [{"tenant": "acme", "n": str(i)} for i in range(3)])
    await app.aschedule(per_domain, "https://a.b.example.co.uk/x")
    backend = await app.backend()
    groups = {g.name: g for g in await backend.group_stats()}
    claimed = await backend.claim(["per_tenant", "per_domain"], worker="w", limit=10, lease=60)
    await app.aclose()
    assert groups["acme"].queued == 3
    assert "example.co.uk" in groups
    assert sorted(c.group for c in claimed.elements) == ["acme", "example.co.uk"]


async def test_start_tasks_are_marked(app: App) -> None:
    @app.task(start=True)
    async def begin(ctx: Context, _: None) -> None: ...

    @app.task
    async def later(ctx: Context, url: str) -> None: ...

    assert app.start_tasks == [begin]
    assert begin.options.group_by.value == "none"


def test_sync_schedule_from_plain_code(app: App) -> None:
    @app.task(group=None)
    async def job(ctx: Context, n: int) -> None: ...

    with app:
        first = app.schedule(job, 1)
        again = app.schedule_many(job, [1, 2, 2, 3], priority=2)
        (stats,) = app.stats(["job"])
    assert (first.added, again.added, again.moved) == (1, 2, 1)
    assert stats.total == 3


async def test_a_task_declared_after_connecting_can_be_scheduled(app: App) -> None:
    @app.task(group=None)
    async def early(ctx: Context, n: int) -> None: ...

    await app.aschedule(early, 1)

    @app.task(group=None)
    async def late(ctx: Context, n: int) -> None: ...

    result = await app.aschedule(late, 1)
    await app.aclose()
    assert result.added == 1


def test_bad_input_is_refused_clearly(app: App) -> None:
    @app.task
    async def fetch(ctx: Context, url: str) -> None: ...

    with app:
        with pytest.raises(InvalidElement, match=r"queue 'fetch'.*malformed URL"):
            app.schedule(fetch, "http://bad.test:port/")
        with pytest.raises(UnknownQueue, match="'nope'"):
            app.schedule("nope", 1)
        with pytest.raises(ConfigError, match="exclude each other"):
            app.schedule(fetch, "http://a.test/", only_if_new=True, only_if_earlier=True)
        with pytest.raises(ConfigError, match="priority must be an integer"):
            app.schedule(fetch, "http://a.test/", priority=1.5)  # type: ignore[arg-type]
        (stats,) = app.stats(["fetch"])
    assert stats.total == 0


def test_task_definitions_are_checked(app: App) -> None:
    @app.task
    async def twice(ctx: Context, n: int) -> None: ...

    with pytest.raises(ConfigError, match="two tasks use queue 'twice'"):
        app.task(queue="twice")(lambda ctx, n: None)
    with pytest.raises(ConfigError, match="group="):
        app.task(group="street")(lambda ctx, n: None)
    with pytest.raises(ConfigError, match="concurrency must be at least 1"):
        app.limit("*", concurrency=0)
    with pytest.raises(ConfigError, match="no task for queue"):
        crawlq.Worker(app, queues=["missing"])


async def test_the_worker_sleeps_until_delayed_work_is_due(app: App) -> None:
    ran_at: list[float] = []

    @app.task(group=None)
    async def later(ctx: Context, n: int) -> None:
        ran_at.append(ctx.claimed_at)

    backend = await app.backend()
    due = backend.now() + 0.3
    await app.aschedule(later, 1, seconds=0.3)
    await run_burst(app)
    await app.aclose()
    assert len(ran_at) == 1
    assert ran_at[0] >= due


def test_backend_urls_are_checked(tmp_path: Path) -> None:
    from crawlq.backends import open_backend

    with pytest.raises(ConfigError, match="not available yet"):
        open_backend("postgresql://127.0.0.1/crawl")
    with pytest.raises(ConfigError, match="unknown backend URL"):
        open_backend("mysql://x")
    with pytest.raises(ConfigError, match="must look like"):
        open_backend("sqlite://")
    # redact() cannot mask a password past a quote or < >, as those end a URL in a text
    for url in ('redis://:P"W@h:6379/0', "redis://u:P<W>@h/0", "redis://u:P W@h/0"):
        with pytest.raises(ConfigError, match="percent-encode it") as caught:
            crawlq.App(url)
        assert "***@h" in str(caught.value) and "P" not in str(caught.value)
    assert crawlq.App("redis://u:p%22w@h:1/0") is not None


async def test_damaged_or_foreign_databases_are_refused(tmp_path: Path) -> None:
    import sqlite3

    from crawlq.backends import open_backend
    from crawlq.errors import BackendCorrupt, BackendUnavailable

    garbage = tmp_path / "garbage.db"
    garbage.write_bytes(b"this is not a database at all" * 100)
    foreign = tmp_path / "foreign.db"
    with sqlite3.connect(foreign) as db:
        db.execute("CREATE TABLE users (name TEXT)")
    cases = [
        (f"sqlite:///{garbage}", BackendCorrupt, "not a SQLite database"),
        (f"sqlite:///{foreign}", BackendCorrupt, "not crawlq's"),
        (f"sqlite:///{tmp_path / 'no' / 'such.db'}", BackendUnavailable, "no such folder"),
    ]
    for url, error, message in cases:
        backend = open_backend(url)
        with pytest.raises(error, match=message):
            await backend.open()
    missing = open_backend(f"sqlite:///{tmp_path / 'missing.db'}", create=False)
    with pytest.raises(BackendUnavailable, match="no crawlq database"):
        await missing.open()
    assert not (tmp_path / "missing.db").exists()


async def test_a_worker_leases_each_element_for_its_own_tasks_lease(app: App) -> None:
    """A crash makes a short task's element wait its own lease, not the longest of the
    worker's tasks'."""
    leased: dict[str, float] = {}

    async def note(ctx: Context) -> None:
        info = await (await ctx.app.backend()).element(ctx.queue, ctx.key)
        assert info is not None and info.lease_until is not None
        leased[ctx.queue] = info.lease_until - ctx.claimed_at

    @app.task(group=None, lease=5)
    async def quick(ctx: Context, n: int) -> None:
        await note(ctx)

    @app.task(group=None, lease=900)
    async def slow(ctx: Context, n: int) -> None:
        await note(ctx)

    await app.aschedule(quick, 1)
    await app.aschedule(slow, 1)
    stats = await run_burst(app)
    await app.aclose()
    assert stats.done == 2
    assert leased == pytest.approx({"quick": 5.0, "slow": 900.0})
