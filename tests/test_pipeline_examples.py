"""The projects in examples/, run as written against local servers on loopback: the nightly
ETL against the demo's partner sites and proxy, recursive discovery against a synthetic web."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest

import crawlq
from crawlq.crawl import Fetcher, FetchSettings, Timeouts
from crawlq.crawl.testing import Site, SyntheticWeb
from crawlq.demo.site import HOSTS, USERNAME, DemoServers, DemoSite, peak_in_flight

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


@pytest.fixture
def examples() -> Iterator[None]:
    sys.path.insert(0, str(EXAMPLES))
    try:
        yield
    finally:
        sys.path.remove(str(EXAMPLES))
        for name in [n for n in sys.modules if n.split(".")[0] in ("nightly_etl", "discovery")]:
            del sys.modules[name]


def fresh(name: str) -> ModuleType:
    return importlib.import_module(name)


@pytest.mark.usefixtures("examples")
async def test_the_nightly_etl_example_runs_against_the_demo_partners(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with DemoServers(DemoSite(reports=40, latency=0.005, errors=0.1)) as servers:
        monkeypatch.setenv("ETL_SITES", " ".join(servers.base(h) for h in HOSTS))
        monkeypatch.setenv("ETL_USER", USERNAME)
        monkeypatch.setenv("ETL_PASSWORD", servers.site.password)
        monkeypatch.setenv("ETL_PROXY", servers.proxy_url)
        monkeypatch.setenv("ETL_RESOLVE", " ".join(f"{h}={a}" for h, a in servers.resolve.items()))
        monkeypatch.setenv("ETL_ALLOW", "127.0.0.0/8")
        monkeypatch.setenv("ETL_DATA", str(tmp_path / "etl"))
        etl = fresh("nightly_etl.etl")
        app: crawlq.App = etl.app
        try:
            await app.aschedule(etl.nightly, None)
            stats = await crawlq.Worker(app, burst=True, burst_horizon=10).run()
            summary = etl.pipeline.run_finish()
        finally:
            await app.aclose()
            etl.pipeline.results.close()
        site = servers.site
        assert stats.by_queue["normalize"] == 40
        assert max(peak_in_flight(site.hits).values()) <= 4
        assert len(servers.proxy_requests) == len(site.hits)
        truth = {p: (t.units, t.cents) for p, t in site.truth().items()}
        assert {r.key: (r.data["units"], r.data["revenue_cents"]) for r in summary} == truth
        assert (tmp_path / "etl" / "report.md").read_text().startswith("# Sales by product")


@pytest.mark.usefixtures("examples")
async def test_the_discovery_example_schedules_references_as_found_and_stops_loops(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with SyntheticWeb([Site(name="docs.test", pages=30)]) as net:
        # page n links to n+1, 2n+1 and 2n+2; the index links back to the first page: a loop
        net.sites["docs.test"].cross_links = [net.url("docs.test", "/page/0")]
        monkeypatch.setenv("DISCOVERY_DATA", str(tmp_path / "docs"))
        discovery = fresh("discovery")
        app: crawlq.App = discovery.app
        settings = FetchSettings(
            resolve=net.resolve,
            resolve_only=True,
            allow_networks=("127.0.0.0/8",),
            timeouts=Timeouts(connect=5, read=5, total=10),
        )
        app.provide("crawlq.fetcher", lambda: Fetcher(settings))
        app.limit("*", concurrency=2)  # no interval: quick
        try:
            await app.aschedule(discovery.seed, net.url("docs.test", "/page/0"))
            stats = await crawlq.Worker(app, burst=True).run()
            documents = list(discovery.pipeline.results.rows("document"))
        finally:
            await app.aclose()
            discovery.pipeline.results.close()
    pages = [h.path for h in net.hits_for("docs.test", pages_only=True)]
    assert sorted(pages) == sorted(f"/page/{n}" for n in range(30))  # each exactly once
    assert stats.by_queue["download"] == stats.by_queue["parse"] == 30
    assert len(documents) == 30
    assert {d["title"] for d in documents} == {f"docs.test page {n}" for n in range(30)}
