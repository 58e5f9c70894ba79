"""The dashboard in a real headless Chromium (Debian's, driven by Playwright) against a running
worker, its token and CSRF guard over real HTTP, `/metrics` against `crawlq stats --json`,
JSON task logs and `crawlq stats --watch`. Screenshots go to artifacts/screenshots/."""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterator
from typing import Any
from urllib.parse import quote, urlencode

import pytest
from playwright.sync_api import Browser, Page, expect, sync_playwright
from prometheus_client.parser import text_string_to_metric_families

from .conftest import SCREENSHOTS, Board, wait_for

CHROMIUM = "/usr/bin/chromium"
LIVE = 15_000  # ms a live update may take (the page refreshes every 1.5 s)


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    if not os.path.exists(CHROMIUM):
        pytest.fail(f"{CHROMIUM} is missing: run `bash scripts/install-chromium.sh`")
    os.environ.setdefault("PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD", "1")
    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=CHROMIUM, headless=True)
        try:
            yield launched
        finally:
            launched.close()


@pytest.fixture
def page(browser: Browser) -> Iterator[Page]:
    context = browser.new_context(viewport={"width": 1400, "height": 900})
    try:
        yield context.new_page()
    finally:
        context.close()


def shot(page: Page, board: Board, name: str) -> None:
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SCREENSHOTS / f"{board.kind}-{name}.png"), full_page=True)


def cell(page: Page, queue: str, field: str) -> Any:
    return page.locator(f"#queues tr[data-queue='{queue}'] [data-field='{field}']")


def test_every_page_live_in_chromium_and_a_dead_letter_requeued_by_click(
    board: Board, page: Page
) -> None:
    assert board.base.startswith("http://127.0.0.1:"), "binds loopback by default"
    page.goto(f"{board.base}/?token={board.token}")
    assert "token" not in page.url, "the token leaves the address bar"
    page.evaluate("window.__sameDocument = 42")

    # Queues: the numbers the backend has, then a change seen without reloading.
    expect(cell(page, "pages", "dead")).to_have_text("3")
    expect(cell(page, "held", "running")).to_have_text("2")
    board.schedule("held", "3", "4", "5")
    expect(cell(page, "held", "running")).to_have_text("5", timeout=LIVE)
    expect(page.locator("#updated")).to_contain_text("live")
    assert page.evaluate("window.__sameDocument") == 42, "updated in place, not reloaded"
    shot(page, board, "queues")

    # Groups: a blocked host, its backlog and why, found with the search box.
    board.crawlq("limits", "block", "slow.test", "--for", "600", "--reason", "Retry-After: 600")
    board.schedule("pages", '"http://slow.test/1"', '"http://slow.test/2"')
    page.click("nav >> text=Groups")
    page.fill("input[name=q]", "slow")
    page.click("form.search button")
    row = page.locator("#groups tr[data-group='slow.test']")
    expect(row.locator("[data-field='queued']")).to_have_text("2", timeout=LIVE)
    expect(row.locator("[data-field='why']")).to_have_text("blocked: Retry-After: 600")
    expect(page.locator("#groups tbody tr")).to_have_count(1)
    shot(page, board, "groups")

    # Workers: the running worker process, its elements in flight.
    page.click("nav >> text=Workers")
    worker = page.locator("#workers tbody tr", has_text=str(board.processes["worker"].pid))
    expect(worker.locator("[data-field='running']")).to_have_text("5", timeout=LIVE)
    expect(worker.locator(".held")).to_contain_text("held: 1")
    expect(worker).to_contain_text("5 / ")
    shot(page, board, "workers")

    # Dead letters: re-queue one by clicking, confirm; the worker then runs it (healed).
    (board.home / "heal").touch()
    page.click("nav >> text=Dead letters")
    expect(page.locator("#dead tbody tr")).to_have_count(3)
    shot(page, board, "dead")
    page.locator("#dead tr", has_text="http://a.test/fail/1").get_by_role(
        "button", name="Re-queue"
    ).click()
    expect(page.locator("h1")).to_have_text("Re-queue?")
    shot(page, board, "confirm")
    page.get_by_role("button", name="Confirm re-queue").click()
    expect(page.locator(".message")).to_have_text("re-queued 1 dead element of pages")
    expect(page.locator("#dead tbody tr")).to_have_count(2)
    wait_for(lambda: "http://a.test/fail/1" in board.records("pages"), "the re-queued page run")

    # ...and purge another.
    page.locator("#dead tr", has_text="http://a.test/fail/2").get_by_role(
        "button", name="Purge"
    ).click()
    page.get_by_role("button", name="Confirm purge").click()
    expect(page.locator(".message")).to_have_text("purged 1 dead element of pages")
    dead = json.loads(board.crawlq("dead", "list", "pages", "--json"))
    assert [d["key"] for d in dead] == ['"http://a.test/fail/3"']
    shot(page, board, "dead-after")

    # One element: what the backend can tell, and what it cannot.
    page.goto(
        f"{board.base}/element?"
        + urlencode({"queue": "pages", "key": '"http://a.test/fail/3"'}, quote_via=quote)
    )
    expect(page.locator("#element")).to_contain_text("Dead: 1 attempt(s)")
    expect(page.locator("#element")).to_contain_text("simulated failure of http://a.test/fail/3")
    expect(page.locator("#history")).to_contain_text("simulated failure of http://a.test/fail/3")
    shot(page, board, "element")
    page.goto(f"{board.base}/element?" + urlencode({"queue": "held", "key": "1"}, quote_via=quote))
    expect(page.locator("#element [data-field=state]")).to_have_text("running")
    expect(page.locator("#element")).to_contain_text("held by")
    expect(page.locator("#history")).to_contain_text("running")
    shot(page, board, "element-running")

    # Back on the queues page: releasing the held elements empties the queue, live.
    page.click("nav >> text=Queues")
    page.evaluate("window.__sameDocument = 43")
    (board.home / "release").touch()
    expect(cell(page, "held", "running")).to_have_text("0", timeout=LIVE)
    expect(cell(page, "held", "total")).to_have_text("0", timeout=LIVE)
    assert page.evaluate("window.__sameDocument") == 43
    expect(page.locator("svg.chart").first).to_be_visible()
    shot(page, board, "queues-after")


def test_the_token_is_required_on_every_page_and_action(board: Board) -> None:
    for path in ["/", "/groups", "/workers", "/dead", "/element", "/metrics", "/api/stats"]:
        status, body = board.request(path, bearer=False)
        assert status == 401, path
        assert "needs its access token" in body
        assert (
            board.request(path, headers={"Authorization": "Bearer wrong"}, bearer=False)[0] == 401
        )
        assert board.request(path)[0] == 200, path
    assert board.request("/?token=wrong", bearer=False)[0] == 401
    status, _ = board.request("/dead/purge", data=b"queue=pages&all=1&confirm=yes", bearer=False)
    assert status == 401
    assert board.queue("pages")["dead"] == 3, "nothing was purged"


def test_actions_need_their_csrf_token_and_a_same_origin(board: Board) -> None:
    session = "0" * 32
    cookie = {"Cookie": f"crawlq_session={session}"}
    status, body = board.request("/dead?queue=pages", headers=cookie)
    token = re.search(r'name="csrf" value="([0-9a-f]{64})"', body)
    assert status == 200 and token is not None
    form = f"queue=pages&all=1&confirm=yes&csrf={token.group(1)}".encode()
    assert (
        board.request("/dead/purge", data=b"queue=pages&all=1&confirm=yes", headers=cookie)[0]
        == 403
    )
    assert board.request("/dead/purge", data=form)[0] == 403, "another session's token"
    foreign = {**cookie, "Origin": "http://evil.test"}
    assert board.request("/dead/purge", data=form, headers=foreign)[0] == 403
    assert board.queue("pages")["dead"] == 3, "nothing was purged"
    assert board.request("/dead/purge", data=form, headers=cookie)[0] == 303
    assert board.queue("pages")["dead"] == 0


def metrics(board: Board) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    status, text = board.request("/metrics")
    assert status == 200
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def test_metrics_parse_and_match_crawlq_stats_json(board: Board) -> None:
    assert len(board.records("pages")) == 2  # the two good pages, acknowledged (the fixture)
    stats = board.stats()
    found: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}

    def agrees() -> bool:
        nonlocal found
        found = metrics(board)
        return all(
            found.get(("crawlq_queue_elements", (("queue", q["name"]), ("state", state))))
            == q[state]
            for q in stats["queues"]
            for state in ("due", "delayed", "running", "dead")
        ) and all(
            found.get(("crawlq_queue_total", (("queue", q["name"]),))) == q["total"]
            for q in stats["queues"]
        )

    wait_for(agrees, "/metrics to show the numbers of `crawlq stats --json`", timeout=10)
    assert stats["queues"], "there are queues to compare"
    assert found[("crawlq_workers", ())] == len(stats["workers"]) == 1
    worker = stats["workers"][0]
    assert found[("crawlq_worker_running", (("worker", worker["id"]),))] == worker["running"] == 2
    # From the worker process, through the multi-process folder:
    done = (("outcome", "done"), ("queue", "pages"))
    dead = (("outcome", "dead"), ("queue", "pages"))
    assert found[("crawlq_tasks_total", done)] == len(board.records("pages")) == 2
    assert found[("crawlq_tasks_total", dead)] == 3
    assert found[("crawlq_task_seconds_count", done)] == 2
    assert found[("crawlq_claimed_elements_total", (("queue", "held"),))] == 2
    assert found[("crawlq_claim_seconds_count", ())] >= 1


def test_task_log_lines_are_json_naming_queue_key_attempt_group_and_worker(
    board: Board,
) -> None:
    pid = board.processes["worker"].pid
    board.stop()  # flushes the worker's log
    lines = [json.loads(line) for line in board.worker_log.read_text().splitlines()]
    failed = [e for e in lines if e["message"].startswith("pages failed")]
    assert len(failed) == 3
    own = [e for e in lines if e["logger"] == "tests.board_app"]
    assert len(own) == 5, "the task's own lines carry the fields too"
    for entry in failed + own:
        assert entry["queue"] == "pages"
        assert entry["key"].startswith('"http://')
        assert entry["attempt"] == 1
        assert entry["group"] in ("a.test", "b.test")
        assert entry["worker"].split(":")[1] == str(pid)
    assert {e["level"] for e in failed} == {"warning"}
    assert board.token not in board.worker_log.read_text()


def test_stats_watch_redraws_the_same_numbers(board: Board) -> None:
    out = board.crawlq(
        "stats", "--watch", "--count", "2", "--interval", "0.1", "--log-level", "error"
    )
    pages = next(line for line in out.splitlines() if re.search(r"\bpages\b.*\d", line))
    numbers = [int(n.replace(",", "")) for n in re.findall(r"\b\d[\d,]*\b", pages)]
    queue = board.queue("pages")
    assert numbers[:5] == [queue[k] for k in ("total", "due", "delayed", "running", "dead")]
    assert str(board.processes["worker"].pid) in out
