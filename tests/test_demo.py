"""The demo ETL against its real partner sites and proxy on loopback: politeness and the
proxy checked from the sites' own log, and reprocessing that sends not a single request."""

from __future__ import annotations

import collections
import logging
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
from rich.console import Console

from crawlq.demo.etl import PARSERS, Etl, Row, build, parse_csv
from crawlq.demo.run import config_for, prepare, run_etl
from crawlq.demo.site import (
    EGRESS_ADDRESS,
    HOSTS,
    DemoServers,
    DemoSite,
    make_report,
    peak_in_flight,
)
from crawlq.results import ResultsStore

REPORTS = 96


@pytest.fixture
def servers() -> Iterator[DemoServers]:
    site = DemoSite(reports=REPORTS, latency=0.01, errors=0.05, crowd=4)
    with DemoServers(site) as running:
        yield running


def snapshot(results: ResultsStore) -> dict[str, list[dict[str, Any]]]:
    """Every row of every record type, without the write times."""
    return {
        type_: [{k: v for k, v in row.items() if k != "_updated"} for row in results.rows(type_)]
        for type_ in results.types()
    }


def units_doubled(text: str) -> list[Row]:
    """A "changed parser": the CSV partner's units now count pairs."""
    return [{**row, "units": str(2 * int(row["units"]))} for row in parse_csv(text)]


async def close(etl: Etl) -> None:
    await etl.app.aclose()
    etl.pipeline.results.close()


async def test_the_etl_is_polite_proxied_and_reprocesses_without_a_request(
    servers: DemoServers, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    site = servers.site
    out = tmp_path / "demo"
    prepare(out)
    etl = build(config_for(servers, out))
    try:
        stats, dead = await run_etl(etl, servers, Console(quiet=True), progress=False)
        etl.pipeline.run_finish()
        first = snapshot(etl.pipeline.results)
    finally:
        await close(etl)

    assert dead == 0
    assert stats.by_queue["download"] == stats.by_queue["parse"] == REPORTS
    # every report fetched, some of them after a transient error
    report_hits = site.report_hits()
    assert {h.path for h in report_hits if h.status == 200} == {
        f"/reports/{n:06d}.{fmt}" for n, fmt in _formats()
    }
    assert any(h.status in (500, 503) for h in report_hits)
    assert site.logins == len(HOSTS)  # one login per sub-domain, reused after
    # at most 4 in flight per sub-domain throughout, and every sub-domain's 12 reports,
    # queued at once, filled its 4 slots (the site holds reports until 4 are in flight)
    assert site.crowd_timeouts == 0
    peaks = peak_in_flight(site.hits)
    assert peaks == dict.fromkeys(HOSTS, 4), peaks
    assert site.peak == dict.fromkeys(HOSTS, 4), site.peak
    # the proxy saw every request, and the sites saw nothing else
    seen_by_sites = collections.Counter(servers.url_of(h) for h in site.hits)
    assert collections.Counter(servers.proxy_requests) == seen_by_sites
    assert {h.peer for h in site.hits} == {EGRESS_ADDRESS}
    assert len(first["line"]) > REPORTS and len(first["summary"]) == 8
    # the password never reaches a log line
    assert site.password not in caplog.text

    requests = len(site.hits)
    proxied = len(servers.proxy_requests)

    changed = build(config_for(servers, out), parsers={**PARSERS, "text/csv": units_doubled})
    try:
        result = await changed.pipeline.reprocess("parse")
        second = snapshot(changed.pipeline.results)
        again = await changed.pipeline.reprocess("parse")
        third = snapshot(changed.pipeline.results)
    finally:
        await close(changed)

    assert len(site.hits) == requests, "reprocessing sent a request to a partner"
    assert len(servers.proxy_requests) == proxied
    assert result.scheduled == again.scheduled == REPORTS
    assert result.stages == ("parse", "normalize")
    assert result.worker is not None and result.worker.by_queue == {
        "parse": REPORTS,
        "normalize": REPORTS,
    }
    csv_reports = {f"{n:06d}" for n, fmt in _formats() if fmt == "csv"}
    for before, after in zip(first["sales"], second["sales"], strict=True):
        assert before["key"] == after["key"]
        factor = 2 if before["report"] in csv_reports else 1
        assert after["units"] == factor * before["units"]
        assert after["revenue_cents"] == before["revenue_cents"]
    assert second != first
    assert third == second  # idempotent: the same rows, no duplicates
    assert [len(second[t]) for t in second] == [len(first[t]) for t in second]

    restored = build(config_for(servers, out))
    try:
        await restored.pipeline.reprocess("parse", where=["*.csv"])
        fourth = snapshot(restored.pipeline.results)
    finally:
        await close(restored)
    assert fourth == first
    assert len(site.hits) == requests


def _formats() -> list[tuple[int, str]]:
    return [(n, make_report(n).format) for n in range(REPORTS)]


@pytest.mark.timeout(300)  # its own limits (120 s) must fail first, with a diagnosis
def test_crawlq_demo_end_to_end_then_reprocess_and_export(tmp_path: Path) -> None:
    """README's first command, small: the real CLI in a subprocess, then the commands the
    demo tells you to run next."""
    env = {**os.environ, "CRAWLQ_DEMO_DIR": str(tmp_path / "demo")}
    crawlq = [sys.executable, "-m", "crawlq"]

    def run(*args: str) -> str:
        done = subprocess.run(
            [*crawlq, *args], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120
        )
        assert done.returncode == 0, done
        return done.stdout

    out = run("demo", "--reports", "60", "--out", "demo", "--latency", "0.005")
    assert "totals equal the partners' own figures: yes" in out, out
    peak = re.search(r"at most (\d+) requests at once per sub-domain \(limit 4\)", out)
    assert peak is not None and 1 <= int(peak[1]) <= 4, out
    assert "all from the egress address: yes" in out, out
    assert "0 dead letters" in out, out
    demo = tmp_path / "demo"
    assert (demo / "report.md").read_text().startswith("# Sales by product")
    summary = pq.read_table(demo / "exports" / "summary.parquet").to_pylist()
    assert [row["product"] for row in summary] == sorted(row["product"] for row in summary)
    assert len(summary) == 8
    assert list(demo.joinpath("warc").glob("*.warc.gz"))
    before = (demo / "exports" / "summary.csv").read_text()

    json_reports = sum(1 for n in range(60) if make_report(n).format == "json")
    out = run("reprocess", "crawlq.demo.app:app", "parse", "--where", "*.json")
    assert out.startswith(
        f"scheduled {json_reports} inputs of parse; ran parse -> normalize: {2 * json_reports} done"
    ), out
    out = run("export", "crawlq.demo.app:app", "summary", "again.csv")
    assert out == "wrote 8 summary records to again.csv\n"
    assert (tmp_path / "again.csv").read_text() == before

    # a folder the demo did not make is never emptied
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "keep.txt").write_text("precious")
    refused = subprocess.run(
        [*crawlq, "demo", "--out", "mine", "--reports", "8"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert refused.returncode == 1
    assert "not a crawlq demo folder" in refused.stderr
    assert (tmp_path / "mine" / "keep.txt").read_text() == "precious"
