"""Link extraction on link-heavy pages: crawlq's `extract` against Scrapy's LinkExtractor.

    python -m benchmarks.links_bench [--pages 300] [--anchors 400] [--rounds 3]

The crawl benchmark's synthetic pages hold two links each; real pages hold hundreds, and
resolving them costs more than fetching them. The pages here are generated (seeded, the
same for both): about 80 KB of HTML each, with `anchors` links of the kinds real pages
hold: relative (page.html, ../dir/page.html, ./x), root-relative with and without a query,
absolute on the same and on other hosts, links to the page's own sections (#id), links
with a fragment, mailto: and javascript:, rel=nofollow, and many repeats (menus, "top"
links). Each side gets the page's bytes and its URL and returns its unique absolute links:
crawlq decodes and runs `crawlq.crawl.links.extract` (title, links resolved, canonical,
unique, nofollow left out); Scrapy builds an HtmlResponse and runs
`LinkExtractor().extract_links` (resolved, unique, fragments cut). Reported: CPU ms a page,
the best of `rounds` rounds, and links a page found by each.
"""

from __future__ import annotations

import argparse
import random
import time
from collections.abc import Callable

WORDS = [
    "crawl",
    "queue",
    "page",
    "host",
    "link",
    "robots",
    "delay",
    "fetch",
    "parse",
    "store",
    "index",
]


def page(rng: random.Random, n: int, anchors: int) -> tuple[str, bytes]:
    """A page's URL and its HTML."""
    depth = rng.randrange(1, 4)
    directory = "/".join(f"d{rng.randrange(20)}" for _ in range(depth))
    url = f"https://www.site{n % 7}.test/{directory}/page{n}.html"
    kinds: list[Callable[[], str]] = [
        lambda: f"page{rng.randrange(200)}.html",
        lambda: f"../d{rng.randrange(20)}/page{rng.randrange(200)}.html",
        lambda: f"./item-{rng.randrange(500)}",
        lambda: f"/d{rng.randrange(20)}/page{rng.randrange(200)}.html",
        lambda: f"/search?q={rng.choice(WORDS)}&page={rng.randrange(9)}",
        lambda: f"https://www.site{n % 7}.test/d{rng.randrange(20)}/page{rng.randrange(200)}.html",
        lambda: f"https://cdn{rng.randrange(3)}.other.test/a/{rng.randrange(1000)}.html",
        lambda: f"#section-{rng.randrange(40)}",
        lambda: f"page{rng.randrange(200)}.html#part-{rng.randrange(9)}",
        lambda: "mailto:someone@example.test",
        lambda: "javascript:void(0)",
    ]
    menu = [f"/d{k}/index.html" for k in range(25)]  # on every page, twice (header, footer)
    parts = ["<!doctype html><html><head><title>Page ", str(n), "</title></head><body>"]
    for href in menu:
        parts.append(f'<a class="nav" href="{href}">{href}</a>')
    for _ in range(anchors - 2 * len(menu)):
        href = rng.choice(kinds)()
        rel = ' rel="nofollow"' if rng.random() < 0.03 else ""
        text = " ".join(rng.choices(WORDS, k=8))
        parts.append(f'<p class="x">{text} <a href="{href}"{rel} title="{text}">{text}</a></p>')
    for href in menu:
        parts.append(f'<a class="nav" href="{href}">{href}</a>')
    parts.append("</body></html>")
    return url, "".join(parts).encode()


def crawlq_extract() -> Callable[[str, bytes], int]:
    from crawlq.crawl.links import extract

    def run(url: str, body: bytes) -> int:
        return len(extract(body.decode("utf-8"), url).links)

    return run


def forget_crawlq_links() -> None:
    """Empties the links crawlq remembers across pages: a round sees each page once, as a
    crawl does, and not again in the next round."""
    from crawlq.crawl import links

    getattr(links, "_resolved", {}).clear()  # (an older crawlq, measured for comparison, has none)


def scrapy_extract() -> Callable[[str, bytes], int]:
    from scrapy.http import HtmlResponse
    from scrapy.linkextractors import LinkExtractor

    extractor = LinkExtractor()

    def run(url: str, body: bytes) -> int:
        response = HtmlResponse(url=url, body=body, encoding="utf-8")
        return len(extractor.extract_links(response))

    return run


def measure(
    run: Callable[[str, bytes], int], pages: list[tuple[str, bytes]], rounds: int
) -> tuple[float, float]:
    """Best CPU seconds a page over `rounds` rounds, and links a page."""
    best, found = float("inf"), 0
    for _ in range(rounds):
        forget_crawlq_links()
        started, found = time.process_time(), 0
        for url, body in pages:
            found += run(url, body)
        best = min(best, time.process_time() - started)
    return best / len(pages), found / len(pages)


def same_links(pages: list[tuple[str, bytes]]) -> int:
    """Pages on which both find the same links, once Scrapy's are made canonical, without
    those of its anchors that are nofollow (crawlq leaves them out) and the page's own URL
    (crawlq skips links to the page's own sections, #id)."""
    from scrapy.http import HtmlResponse
    from scrapy.linkextractors import LinkExtractor

    from crawlq.crawl.links import extract
    from crawlq.crawl.urls import canonicalize

    extractor = LinkExtractor(unique=False)  # every anchor: a link may be nofollow once
    same = 0
    for url, body in pages:
        ours = set(extract(body.decode("utf-8"), url).links) - {url}
        response = HtmlResponse(url=url, body=body, encoding="utf-8")
        links = extractor.extract_links(response)
        theirs = {canonicalize(link.url) for link in links if not link.nofollow} - {url}
        same += ours == theirs
    return same


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pages", type=int, default=300)
    parser.add_argument("--anchors", type=int, default=400)
    parser.add_argument("--rounds", type=int, default=3)
    options = parser.parse_args()
    rng = random.Random(42)
    pages = [page(rng, n, options.anchors) for n in range(options.pages)]
    size = sum(len(body) for _, body in pages) / len(pages)
    print(
        f"{options.pages} pages of {size / 1000:.0f} KB, {options.anchors} anchors each; "
        f"best of {options.rounds} rounds, CPU a page"
    )
    results = {
        "crawlq": measure(crawlq_extract(), pages, options.rounds),
        "scrapy": measure(scrapy_extract(), pages, options.rounds),
    }
    print("| extractor | CPU ms a page | links a page | x Scrapy (speed) |")
    print("|---|---|---|---|")
    for name, (seconds, links) in results.items():
        ratio = results["scrapy"][0] / seconds if name == "crawlq" else 1.0
        print(f"| {name} | {seconds * 1e3:.2f} | {links:.1f} | {ratio:.1f}x |")
    print(
        f"Same links on {same_links(pages)} of {len(pages)} pages (Scrapy's made canonical, "
        "without its nofollow ones and the page's own URL; Scrapy counts a link with each "
        "#fragment apart)."
    )


if __name__ == "__main__":
    main()
