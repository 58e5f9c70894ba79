"""What a crawler reads from an HTML page: its title and the links it may follow."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from selectolax.lexbor import LexborHTMLParser

from .urls import absolute, is_canonical, origin_of

SKIPPED_SCHEMES = ("javascript:", "mailto:", "tel:", "data:", "ftp:")
#: Links resolved on earlier pages are kept (at most this many), by the href and what its
#: link depends on besides it: a site's pages repeat their menus, footers and neighbours.
MAX_RESOLVED = 50_000
#: What one page may put in its record and in the queue, whatever it holds (a hostile page's
#: 10 MB <title> made a 10 MB line of pages.jsonl, its million links a million-element
#: schedule): a title longer than MAX_TITLE_CHARS is cut to that many characters, the last
#: of them TITLE_CUT; at most MAX_LINKS links are read, the first in page order, and the
#: link elements after the one that gave the last of them are counted, unread
#: (`PageLinks.dropped`: duplicates, nofollow and mailto: ones among them counted too).
MAX_TITLE_CHARS = 1_000
TITLE_CUT = "\N{HORIZONTAL ELLIPSIS}"
MAX_LINKS = 10_000
_resolved: dict[tuple[str, str], str | None] = {}


@dataclass(frozen=True, kw_only=True, slots=True)
class PageLinks:
    title: str | None
    links: list[str]  # absolute, canonical, unique, in page order
    nofollow: bool  # the page's robots meta tag says not to follow its links
    dropped: int = 0  # link elements after the MAX_LINKS-th link, unread


def extract(html: str, url: str) -> PageLinks:
    """Links of `a` and `area` elements, resolved against `<base href>` if the page has one;
    `rel=nofollow` links are left out.

    Elements are found by tag name: a tree's first CSS query costs more than parsing a small
    page. An `a` or `meta` without the attribute read yields nothing, as `a[href]` or
    `meta[name]` would not have matched."""
    tree = LexborHTMLParser(html)
    titles = tree.tags("title")
    title = titles[0].text(strip=True) if titles else None
    if title and len(title) > MAX_TITLE_CHARS:
        title = title[: MAX_TITLE_CHARS - len(TITLE_CUT)] + TITLE_CUT
    base = url
    base_node = next((node for node in tree.tags("base") if "href" in node.attributes), None)
    if base_node is not None:
        resolved = absolute(url, base_node.attributes.get("href") or "")
        base = resolved or url
    base_origin = origin_of(base) if is_canonical(base) else None
    nofollow = False
    for meta in tree.tags("meta"):
        name = (meta.attributes.get("name") or "").lower()
        content = (meta.attributes.get("content") or "").lower()
        if name == "robots" and ("nofollow" in content or "none" in content):
            nofollow = True
    # `a` and `area` in document order: CSS tells it when the page has both (rare).
    anchors = tree.css("a[href], area[href]") if tree.tags("area") else tree.tags("a")
    links: list[str] = []
    found: set[str] = set()
    known: dict[str, str | None] = {}  # href -> link, on this page
    resolve = _resolver(base, base_origin)
    nodes = iter(anchors)
    dropped = 0
    for node in nodes:
        attributes = node.attributes
        if "nofollow" in (attributes.get("rel") or "").lower():
            continue
        href = attributes.get("href") or ""
        if href in known:
            link = known[href]
        else:
            link = known[href] = resolve(href)
        if link is not None and link not in found:
            found.add(link)
            links.append(link)
            if len(links) == MAX_LINKS:
                dropped = sum(1 for _ in nodes)
                break
    return PageLinks(title=title or None, links=links, nofollow=nofollow, dropped=dropped)


def _resolver(base: str, base_origin: str | None) -> Callable[[str], str | None]:
    """What resolves the hrefs of a page whose links resolve against `base` (canonical when
    `base_origin`, its origin, is given): remembered across pages by what each depends on,
    the base's origin for a root-relative href, its document for a query alone, else its
    directory (an absolute URL depends on none, so any will do)."""
    if base_origin is None:
        return lambda href: _plain(href, base, None)
    document = base.partition("?")[0]
    directory = document[: document.rfind("/") + 1]

    def resolve(href: str) -> str | None:
        first = href.lstrip()[:1]
        key = (base_origin if first == "/" else document if first == "?" else directory, href)
        try:
            return _resolved[key]
        except KeyError:
            if len(_resolved) >= MAX_RESOLVED:
                _resolved.clear()
            link = _resolved[key] = _plain(href, base, base_origin)
            return link

    return resolve


def _plain(href: str, base: str, base_origin: str | None) -> str | None:
    """`href`'s link; None for a scheme a crawler skips."""
    if ":" in href and href.strip().lower().startswith(SKIPPED_SCHEMES):
        return None
    return absolute(base, href, base_origin=base_origin)
