"""A redirect to another host, handed back to the queue as a page of its own (crawler.py
`_hand_off`): the redirect limit still holds over the hops that cross hosts."""

from __future__ import annotations

from pathlib import Path

import pytest

from crawlq.backends import open_backend
from crawlq.crawl.crawler import Crawl
from crawlq.crawl.errors import FetchError, Reason
from crawlq.crawl.fetcher import Fetcher
from crawlq.crawl.politeness import Politeness
from crawlq.crawl.scope import Scope
from crawlq.crawl.testing import Site, SyntheticWeb, redirect, respond
from crawlq.crawl.testing.sites import page_html

from .conftest import crawl_settings, fetch_settings
from .test_crawl import records_by_url

HOPS = 60


async def test_redirects_bouncing_between_two_hosts_stop_at_the_redirect_limit(
    tmp_path: Path,
) -> None:
    """a.test/hop/n redirects to b.test/hop/n+1 and b.test/hop/n to a.test/hop/n+1, each a
    new URL: followed in place the chain met the redirect limit; handed from host to host,
    each hop a page of its own, it must meet it too, budget or no budget."""
    sites = [Site(name="a.test", pages=0), Site(name="b.test", pages=0)]
    async with SyntheticWeb(sites) as net:
        for n in range(HOPS):
            for here, there in (("a.test", "b.test"), ("b.test", "a.test")):
                net.sites[here].routes[f"/hop/{n}"] = redirect(net.url(there, f"/hop/{n + 1}"))
        settings = crawl_settings(
            net, tmp_path, max_pages=3, fetch=fetch_settings(net, max_redirects=4)
        )
        crawl = Crawl(settings)
        await crawl.run([net.url("a.test", "/hop/0")], concurrency=4)
        fetched = net.hits_for("a.test", pages_only=True) + net.hits_for("b.test", pages_only=True)
    # The seed and 4 redirects are fetched; the fifth is refused, recorded as too many.
    assert len(fetched) == 5
    records = records_by_url(tmp_path)
    assert len(records) == 5
    (last,) = records[net.url("a.test", "/hop/4")]  # its redirect would be the fifth
    assert last["error"] == "too_many_redirects"
    assert last["queued"] == 0


async def test_a_redirect_loop_between_two_hosts_fetches_each_url_once(tmp_path: Path) -> None:
    """a.test/x -> b.test/y -> a.test/x: each a page of its own, each fetched once, and the
    crawl ends (a URL already seen is not queued again)."""
    sites = [Site(name="a.test", pages=0), Site(name="b.test", pages=0)]
    async with SyntheticWeb(sites) as net:
        net.sites["a.test"].routes["/x"] = redirect(net.url("b.test", "/y"))
        net.sites["b.test"].routes["/y"] = redirect(net.url("a.test", "/x"))
        crawl = Crawl(crawl_settings(net, tmp_path))
        await crawl.run([net.url("a.test", "/x")], concurrency=4)
        fetched = net.hits_for("a.test", pages_only=True) + net.hits_for("b.test", pages_only=True)
    assert sorted(hit.path for hit in fetched) == ["/x", "/y"]
    records = records_by_url(tmp_path)
    assert [r["queued"] for r in records[net.url("a.test", "/x")]] == [1]
    assert [r["queued"] for r in records[net.url("b.test", "/y")]] == [0]


@pytest.mark.parametrize(
    ("location", "domains"), [("http://1.2.3.4.5/", False), ("http://x%zz.a.test/", True)]
)
async def test_a_redirect_to_a_host_no_host_name_has_is_a_bad_response(
    tmp_path: Path, location: str, domains: bool
) -> None:
    """A hop whose host cannot be read (an IPv4 address of five numbers, a bad escape) was
    let through by the scope (no domains, or a host read loosely) and then broke the hop
    check with InvalidElement: the page failed as a task, attempt after attempt, to a dead
    letter. It is a bad answer of the page, recorded once."""
    async with SyntheticWeb([Site(name="a.test", pages=0)]) as net:
        net.sites["a.test"].routes["/go"] = redirect(location)
        scope = Scope(domains=("a.test",)) if domains else Scope()
        settings = crawl_settings(net, tmp_path, scope=scope)
        stats = await Crawl(settings).run([net.url("a.test", "/go")])
    (record,) = records_by_url(tmp_path)[net.url("a.test", "/go")]
    assert (record["error"], record["status"], record["retry"]) == ("bad_response", 302, False)
    assert stats.dead == 0


async def test_the_hops_on_the_way_to_another_host_count_as_fetched(tmp_path: Path) -> None:
    """a.test/x -> a.test/y -> b.test/z: /y was fetched on the way, as when the chain was
    followed to its end, so the link to it that b.test/z holds is not fetched again."""
    sites = [Site(name="a.test", pages=0), Site(name="b.test", pages=0)]
    async with SyntheticWeb(sites) as net:
        net.sites["a.test"].routes["/x"] = redirect("/y")
        net.sites["a.test"].routes["/y"] = redirect(net.url("b.test", "/z"))
        net.sites["b.test"].routes["/z"] = respond(200, page_html("z", [net.url("a.test", "/y")]))
        await Crawl(crawl_settings(net, tmp_path)).run([net.url("a.test", "/x")])
    assert [hit.path for hit in net.hits_for("a.test", pages_only=True)] == ["/x", "/y"]
    assert [hit.path for hit in net.hits_for("b.test", pages_only=True)] == ["/z"]


async def test_a_user_tasks_polite_fetch_of_a_redirect_to_a_host_no_host_name_has_fails_as_data(
    tmp_path: Path,
) -> None:
    """The same hop outside the crawler (a task's `ctx.fetch`, through Politeness.fetch):
    a FetchError of the page, not InvalidElement out of the fetch."""
    backend = open_backend(f"sqlite:///{tmp_path / 'queue.db'}")
    await backend.open()
    try:
        async with SyntheticWeb([Site(name="a.test", pages=0)]) as net:
            net.sites["a.test"].routes["/go"] = redirect("http://1.2.3.4.5/")
            async with Fetcher(fetch_settings(net)) as fetcher:
                with pytest.raises(FetchError) as caught:
                    await Politeness(backend).fetch(fetcher, net.url("a.test", "/go"))
    finally:
        await backend.close()
    assert caught.value.reason is Reason.BAD_RESPONSE
    assert caught.value.url == net.url("a.test", "/go")
