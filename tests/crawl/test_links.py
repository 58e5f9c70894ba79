"""Link extraction: what a page yields, element by element."""

from __future__ import annotations

from urllib.parse import urljoin

from crawlq.crawl.links import MAX_LINKS, MAX_TITLE_CHARS, TITLE_CUT, extract
from crawlq.crawl.urls import MAX_URL_LENGTH, canonicalize

PAGE = "http://site.test/dir/page"


def test_links_in_page_order_resolved_deduped_and_filtered() -> None:
    html = (
        "<html><head><title> The page </title></head><body>"
        '<a href="/a">a</a><a>no href</a><a href>empty</a>'
        '<map><area href="b"><area></map>'
        '<a href="javascript:x()">js</a><a href=" MAILTO:me@site.test">mail</a>'
        '<a rel="NoFollow" href="/hidden">nf</a><a href="#top">frag</a>'
        '<a href="HTTP://Other.TEST:80/c?q=%7e">c</a><a href="/a">again</a>'
        '<svg><a href="/in-svg"></a></svg>'
    )
    page = extract(html, PAGE)
    assert page.title == "The page"
    assert page.links == [
        "http://site.test/a",
        "http://site.test/dir/b",
        "http://other.test/c?q=~",
        "http://site.test/in-svg",
    ]
    assert page.nofollow is False


def test_area_before_a_keeps_document_order() -> None:
    page = extract('<area href="/first"><a href="/second"></a><area href="/third">', PAGE)
    assert page.links == [
        "http://site.test/first",
        "http://site.test/second",
        "http://site.test/third",
    ]


def test_first_base_with_href_resolves_links() -> None:
    html = '<base target="_top"><base href="http://cdn.test/x/"><base href="/ignored/"><a href="y">'
    assert extract(html, PAGE).links == ["http://cdn.test/x/y"]
    assert extract('<base href="mailto:x"><a href="y">', PAGE).links == ["http://site.test/dir/y"]


def test_robots_meta_nofollow() -> None:
    assert extract('<meta name="ROBOTS" content="noindex, NOFOLLOW">', PAGE).nofollow
    assert extract('<meta name="robots" content="none">', PAGE).nofollow
    assert not extract('<meta content="nofollow"><meta name="x" content="none">', PAGE).nofollow


def test_first_title_and_no_title() -> None:
    assert extract("<title>One</title><title>Two</title>", PAGE).title == "One"
    assert extract("<title>  </title><p>text</p>", PAGE).title is None
    assert extract("<p>text</p>", PAGE).title is None


def test_a_link_remembered_from_another_page_resolves_against_this_one() -> None:
    """Links are remembered across pages by what they depend on: the same hrefs on pages of
    other origins, directories, documents or bases resolve anew."""
    hrefs = ["x.html", "../y", "/z", "?q=1", "//other.test/w", "http:v", "https://o.test/u"]
    html = "".join(f'<a href="{href}">.</a>' for href in hrefs)
    pages = [
        "http://a.test/d1/page",
        "http://a.test/d1/other?x=1",
        "http://a.test/d2/page",
        "https://a.test/d1/page",
        "http://b.test:8080/d1/page",
    ]
    for url in pages * 2:  # the second time round, every href was seen before
        assert extract(html, url).links == [
            link for link in (_parsed(url, href) for href in hrefs) if link is not None
        ], url
    based = '<base href="http://c.test/e/f/">' + html
    assert extract(based, pages[0]).links[0] == "http://c.test/e/f/x.html"


def _parsed(base: str, href: str) -> str | None:
    return canonicalize(urljoin(base, href))


def test_a_link_longer_than_a_server_takes_is_no_link() -> None:
    """A page's junk or hostile link of 70,000 characters would be an element too large for
    the queue, failing the page that found it: no link at all, as for a mailto: one."""
    long_path = "/" + "x" * MAX_URL_LENGTH
    longest = "/" + "x" * (MAX_URL_LENGTH - len("https://a.test/"))
    html = (
        f'<a href="/ok">ok</a><a href="{long_path}">long</a>'
        f'<a href="https://a.test{long_path}">absolute</a><a href="x{long_path}">relative</a>'
        f'<a href="?{"q" * 70_000}">query</a><a href="{longest}">longest</a>'
    )
    page = extract(html, "https://a.test/dir/page")
    assert page.links == ["https://a.test/ok", "https://a.test" + longest]
    assert len(page.links[1]) == MAX_URL_LENGTH
    assert canonicalize("https://a.test" + long_path) is None
    assert canonicalize("https://a.test/" + "%41" * MAX_URL_LENGTH) is None


def test_a_title_longer_than_the_cap_is_cut_with_a_marker() -> None:
    """A hostile page's title of 10 MB made a 10 MB line of pages.jsonl: a title is cut to
    MAX_TITLE_CHARS characters, the last of them TITLE_CUT; one of that length stays whole."""
    long_title = "t\u00e9" * 50_000
    page = extract(f"<title>{long_title}</title>", PAGE)
    assert page.title is not None and len(page.title) == MAX_TITLE_CHARS
    assert page.title == long_title[: MAX_TITLE_CHARS - len(TITLE_CUT)] + TITLE_CUT
    whole = "w" * MAX_TITLE_CHARS
    assert extract(f"<title>{whole}</title>", PAGE).title == whole


def test_at_most_max_links_links_are_read_and_the_elements_after_them_counted() -> None:
    """A page of a million links made a million-element schedule and record: the first
    MAX_LINKS distinct links are read, in page order, and the link elements after the one
    that gave the last of them are counted, unread (a repeat among them counted too)."""
    hrefs = [f"/p/{n}" for n in range(MAX_LINKS + 5)]
    anchors = [f'<a href="{href}">x</a>' for href in hrefs]
    anchors.insert(10, '<a href="/p/0">again</a><a href="mailto:me@site.test">m</a>')
    page = extract("".join(anchors) + '<a href="/p/3">again</a>', PAGE)
    assert page.links == [f"http://site.test{href}" for href in hrefs[:MAX_LINKS]]
    assert page.dropped == 6  # /p/10000 to /p/10004, and the last /p/3
    exact = extract("".join(anchors[: MAX_LINKS + 1]), PAGE)  # the repeat and mailto: skipped
    assert len(exact.links) == MAX_LINKS and exact.dropped == 0
