"""Bodies: Content-Encoding undone within the cap, whatever the stream's shape, and charsets
detected on a bounded sample."""

from __future__ import annotations

import gzip
import zlib
from typing import Any

import charset_normalizer
import pytest

from crawlq.crawl.decoding import DETECT_BYTES, decode_content, decode_text
from crawlq.crawl.errors import FetchError, Reason


def test_a_gzip_body_of_several_members_is_decoded_whole() -> None:
    body = gzip.compress(b"<p>one</p>") + gzip.compress(b"<p>two</p>")
    assert decode_content(body, "gzip", max_bytes=100, url="u") == b"<p>one</p><p>two</p>"


def test_the_cap_counts_every_member_together() -> None:
    body = gzip.compress(b"a" * 60) + gzip.compress(b"b" * 60)
    with pytest.raises(FetchError) as caught:
        decode_content(body, "gzip", max_bytes=100, url="u")
    assert caught.value.reason is Reason.TOO_LARGE


def test_bytes_after_the_last_member_are_ignored_and_a_truncated_stream_gives_what_it_has() -> None:
    whole = gzip.compress(b"x" * 50)
    assert decode_content(whole + b"\0\0junk", "gzip", max_bytes=100, url="u") == b"x" * 50
    assert decode_content(whole[:-8], "gzip", max_bytes=100, url="u") == b"x" * 50


@pytest.mark.parametrize("coding", ["gzip", "deflate", "gzip, gzip"])
def test_a_bomb_stops_at_the_cap_not_at_its_size(coding: str) -> None:
    packed = bytes(64 << 20)
    for layer in coding.split(", "):
        packed = gzip.compress(packed) if layer == "gzip" else zlib.compress(packed)
    with pytest.raises(FetchError) as caught:
        decode_content(packed, coding, max_bytes=1 << 20, url="u")
    assert caught.value.reason is Reason.TOO_LARGE


def test_charset_detection_reads_a_sample_not_the_whole_body(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Detecting on all of a 10 MB Latin-1 page held the event loop for over a second."""
    seen: list[int] = []
    detect = charset_normalizer.from_bytes

    def spy(data: bytes, *args: Any, **kwargs: Any) -> Any:
        seen.append(len(data))
        return detect(data, *args, **kwargs)

    monkeypatch.setattr(charset_normalizer, "from_bytes", spy)
    body = "<p>caf\xe9 cr\xe8me br\xfbl\xe9e</p>\n".encode("latin-1") * 400_000
    text = decode_text(body, None, "u")
    assert seen == [DETECT_BYTES]
    assert len(text) == len(body) and text.startswith("<p>caf")


@pytest.mark.parametrize("charset", ["base64", "rot13", "hex", "zlib", "bz2", "undefined", "idna"])
def test_a_charset_that_is_no_web_pages_is_ignored_not_a_crash(charset: str) -> None:
    """Python's codecs registry knows base64, zlib, rot13 and its own `undefined`: decoding
    with them raised LookupError or UnicodeError, which the crawl did not expect."""
    body = "<p>café</p>".encode()
    assert decode_text(body, charset, "u") == "<p>café</p>"
    meta = f'<meta charset="{charset}"><p>café</p>'
    assert decode_text(meta.encode(), None, "u") == meta
