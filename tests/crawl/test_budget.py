"""The page budget (`--max-pages`): distinct URLs, kept on disk, a URL charged once however
often it is admitted."""

from __future__ import annotations

import asyncio
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from crawlq.crawl import CrawlSettings
from crawlq.crawl.budget import BUDGET_FILE, PageBudget
from crawlq.errors import ConfigError


async def test_the_budget_charges_each_url_once_and_admits_it_again_for_free(
    tmp_path: Path,
) -> None:
    budget = PageBudget(tmp_path, 3)
    try:
        assert await budget.admit(["a", "b", "a", "c", "d"]) == ["a", "b", "c"]
        assert await budget.admit(["e", "b"]) == ["b"]  # b was charged before; e is over
        used = budget.used()
    finally:
        await budget.aclose()
    assert used == 3


async def test_admits_waiting_together_charge_a_url_they_share_once(tmp_path: Path) -> None:
    """Two pages finding the same new link at once: one charge, both may schedule it (the
    queue keeps it once), whichever of them is first."""
    budget = PageBudget(tmp_path, 3)
    try:
        first, second, third = await asyncio.gather(
            budget.admit(["a", "shared"]), budget.admit(["shared", "b"]), budget.admit(["c"])
        )
        used = budget.used()
    finally:
        await budget.aclose()
    assert (first, second, third) == (["a", "shared"], ["shared", "b"], [])
    assert used == 3


async def test_a_resumed_crawl_keeps_its_budget_and_what_it_charged(tmp_path: Path) -> None:
    first = PageBudget(tmp_path, 2)
    try:
        await first.admit(["a", "b"])
    finally:
        await first.aclose()
    resumed = PageBudget(tmp_path, 2)
    try:
        assert await resumed.admit(["c", "a", "b"]) == ["a", "b"]
        used = resumed.used()
    finally:
        await resumed.aclose()
    assert used == 2


async def test_a_budget_file_of_the_counting_kind_goes_on_counting(tmp_path: Path) -> None:
    """A budget begun before the budget knew its URLs: its count stands."""
    with sqlite3.connect(tmp_path / BUDGET_FILE) as db:
        db.execute("CREATE TABLE budget (id INTEGER PRIMARY KEY, used INTEGER)")
        db.execute("INSERT INTO budget (id, used) VALUES (1, 4)")
    db.close()
    budget = PageBudget(tmp_path, 5)
    try:
        assert await budget.admit(["x", "y"]) == ["x"]
        assert await budget.admit(["x"]) == ["x"]
        used = budget.used()
    finally:
        await budget.aclose()
    assert used == 5


async def test_without_a_limit_every_url_is_admitted_and_nothing_is_stored(
    tmp_path: Path,
) -> None:
    budget = PageBudget(tmp_path, None)
    assert await budget.admit(["a", "b", "a"]) == ["a", "b", "a"]
    await budget.aclose()
    assert not (tmp_path / BUDGET_FILE).exists()
    assert budget.used() == 0


def test_a_budget_below_one_page_is_refused_before_anything_is_written(tmp_path: Path) -> None:
    out = tmp_path / "crawl"
    with pytest.raises(ConfigError, match="max_pages must be at least 1, got 0"):
        CrawlSettings(out=out, max_pages=0)
    command = [sys.executable, "-m", "crawlq", "crawl", "http://a.test/", "--out", str(out)]
    done = subprocess.run(
        [*command, "--max-pages", "-3"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode != 0
    assert "max_pages must be at least 1, got -3" in done.stderr
    assert not out.exists()
