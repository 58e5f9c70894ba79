"""Link extraction: what a page yields, element by element."""

from __future__ import annotations

from crawlq.crawl.links import extract

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
