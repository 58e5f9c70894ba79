"""Pages read for their links: small ones on the event loop, middling ones in threads, large
ones in child processes that a runaway parse cannot outlast."""

from __future__ import annotations

import asyncio
import os
import signal
import threading

import pytest

from crawlq.crawl import page_reader
from crawlq.crawl.errors import FetchError, Reason
from crawlq.crawl.links import MAX_LINKS, MAX_TITLE_CHARS, PageLinks, extract
from crawlq.crawl.page_reader import INLINE_CHARS, THREAD_CHARS, PageReader, inline

from .conftest import started_children

URL = "http://a.test/dir/page"
#: 6,000 anchors: more tags than a page read on the event loop may have.
MANY = (
    "<html><head><title>Many \u2013 \u00fcn\u00ef</title></head><body>"
    + "".join(f"<p><a href='../p/{n}?q=\u00e9#f'>{n}</a><a href=/p/{n}>2</a>" for n in range(3_000))
    + "<a href='https://b.test/x'>b</a><a rel=nofollow href='/no'>no</a></body></html>"
)
DEEP = "<html><body>" + "<div>" * 40_000 + "<a href='/under'>u</a>"  # seconds to parse


async def test_pages_of_a_middling_size_are_read_in_threads(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """lexbor lets go of the GIL while it parses: the loop goes on meanwhile."""
    threads: list[str] = []

    def extract_noting(html: str, url: str) -> PageLinks:
        threads.append(threading.current_thread().name)
        return extract(html, url)

    monkeypatch.setattr(page_reader, "extract", extract_noting)
    started = started_children(monkeypatch)
    middling = MANY[: page_reader.THREAD_CHARS]
    reader = PageReader()
    try:
        pages = await asyncio.gather(*(reader.links(middling, f"{URL}/{n}") for n in range(4)))
        assert await reader.links(middling[: INLINE_CHARS - 1], URL) is not None
    finally:
        await reader.aclose()
    assert pages == [extract(middling, f"{URL}/{n}") for n in range(4)]
    assert [name.startswith("crawlq-links") for name in threads] == [True] * 4 + [False]
    assert started == []


def test_only_small_pages_are_read_inline_whatever_their_markup() -> None:
    """lexbor is quadratic in nesting and in one tag's attributes, which need no "<"."""
    assert inline("<p>" * (INLINE_CHARS // 3))
    assert not inline("<p>" + "text " * 4_000)
    assert not inline("<a " + " ".join(f"a{n}" for n in range(4_000)) + ">")
    assert not inline(MANY)


async def test_a_tag_of_tens_of_thousands_of_attributes_is_read_in_a_child(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """50,000 attributes on one tag (339 KB, one "<") took lexbor 4.8 s on the event loop."""
    started = started_children(monkeypatch)
    reader = PageReader(timeout=0.5)
    many = "<a href=/x " + " ".join(f"a{n:x}" for n in range(50_000)) + ">x</a>"
    try:
        with pytest.raises(FetchError) as caught:
            await reader.links(many, URL)
    finally:
        await reader.aclose()
    assert caught.value.reason is Reason.TIMEOUT
    assert [process.returncode for process in started] == [-signal.SIGKILL]


async def test_a_child_reads_the_same_title_and_links_as_the_event_loop(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    started = started_children(monkeypatch)
    reader = PageReader()
    try:
        for base in (URL, "http://c.test/other/", URL):
            assert await reader.links(MANY, base) == extract(MANY, base)
        small = "<title>s</title><a href='x'>x</a>"
        assert await reader.links(small, URL) == extract(small, URL)
        assert started[0].pid == os.getsid(started[0].pid)  # a Ctrl-C's SIGINT misses it
    finally:
        await reader.aclose()
    assert len(started) == 1  # one child read them all, one after another
    assert started[0].returncode == -signal.SIGKILL  # ended with the reader


async def test_a_child_caps_the_title_and_links_and_says_how_many_it_dropped(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A page too large for a thread is read in a child, which caps its title and links as
    the event loop does, and tells the parent how many link elements it left unread."""
    started = started_children(monkeypatch)
    html = f"<title>{'t' * 100_000}</title>" + "".join(
        f"<a href=/p/{n}>{n}</a>" for n in range(MAX_LINKS + 20)
    )
    assert len(html) > THREAD_CHARS
    reader = PageReader()
    try:
        page = await reader.links(html, URL)
    finally:
        await reader.aclose()
    assert len(started) == 1
    assert page == extract(html, URL)
    assert page.title is not None and len(page.title) == MAX_TITLE_CHARS
    assert (len(page.links), page.dropped) == (MAX_LINKS, 20)


async def test_a_runaway_parse_is_killed_and_the_next_page_gets_a_new_child(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    started = started_children(monkeypatch)
    reader = PageReader(timeout=0.5)
    try:
        with pytest.raises(FetchError) as caught:
            await reader.links(DEEP, URL)
        assert caught.value.reason is Reason.TIMEOUT
        assert "parsing the page took over 0.5s" in str(caught.value)
        assert started[0].returncode == -signal.SIGKILL
        assert await reader.links(MANY, URL) == extract(MANY, URL)
    finally:
        await reader.aclose()
    assert len(started) == 2


async def test_a_child_that_died_fails_its_page_only(monkeypatch: pytest.MonkeyPatch) -> None:
    started = started_children(monkeypatch)
    reader = PageReader()
    try:
        await reader.links(MANY, URL)
        os.kill(started[0].pid, signal.SIGKILL)  # as the kernel's OOM killer would
        with pytest.raises(RuntimeError, match=r"its process ended \(exit code -?\d+\)"):
            await reader.links(MANY, URL)
        assert await reader.links(MANY, URL) == extract(MANY, URL)
    finally:
        await reader.aclose()
    assert len(started) == 2


async def test_a_cancelled_read_kills_its_child(monkeypatch: pytest.MonkeyPatch) -> None:
    started = started_children(monkeypatch)
    reader = PageReader()
    read = asyncio.create_task(reader.links(DEEP, URL))
    while not started:  # the child is up; its parse takes seconds
        await asyncio.sleep(0.01)
    read.cancel()
    with pytest.raises(asyncio.CancelledError):
        await read
    assert started[0].returncode == -signal.SIGKILL
    await reader.aclose()


async def test_at_most_processes_children_read_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    started = started_children(monkeypatch)
    reader = PageReader(processes=2)
    try:
        pages = await asyncio.gather(*(reader.links(MANY, f"{URL}/{n}") for n in range(6)))
    finally:
        await reader.aclose()
    assert pages == [extract(MANY, f"{URL}/{n}") for n in range(6)]
    assert len(started) == 2
