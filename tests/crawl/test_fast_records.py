"""The crawler's hand-built records and cached checks give what the general code gives: WARC
records byte for byte as warcio builds them, `is_canonical` as `canonicalize` says."""

from __future__ import annotations

import base64
import gzip
import hashlib
import io
import uuid
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from warcio.archiveiterator import ArchiveIterator
from warcio.statusandheaders import StatusAndHeaders
from warcio.warcwriter import WARCWriter

from crawlq.crawl import warc
from crawlq.crawl.guard import AddressGuard
from crawlq.crawl.redact import redact_header, redact_url
from crawlq.crawl.response import Response
from crawlq.crawl.urls import canonicalize, is_canonical
from crawlq.crawl.warc import RotatingWarcWriter, read_record, response_record, warc_date

RESPONSES = [
    Response(
        url="http://site1.test/page/0",
        status=200,
        reason="OK",
        http_version="HTTP/1.1",
        headers=(("Content-Type", "text/html; charset=utf-8"), ("Content-Length", "5")),
        raw=b"hello",
        body=b"hello",
        fetched_at=1_700_000_000.123456,
        elapsed=0.01,
    ),
    Response(
        url="http://user:secret@site1.test:8080/a?b=c",
        status=404,
        reason="",
        http_version="HTTP/1.0",
        headers=(
            ("Transfer-Encoding", "chunked"),
            ("Set-Cookie", "session=abc"),
            ("X-Latin", "caf\xe9\x01"),
            ("Content-Encoding", "gzip"),
        ),
        raw=gzip.compress(b"not found"),
        body=b"not found",
        fetched_at=1_700_000_001.5,
        elapsed=0.01,
    ),
    Response(
        url="https://site2.test/empty",
        status=301,
        reason="Moved \xe9",
        http_version="HTTP/1.1",
        headers=(("Location", "/x"),),
        raw=b"",
        body=b"",
        fetched_at=1_700_000_002.0,
        elapsed=0.01,
    ),
]


def _warcio_record(response: Response, record_id: uuid.UUID) -> bytes:
    """What the writer wrote through warcio before it built records itself."""
    headers = [
        (warc._ascii(k), warc._ascii(redact_header(k, v)))
        for k, v in response.headers
        if k.lower() != "transfer-encoding"
    ]
    status_line = warc._ascii(f"{response.status} {response.reason}".strip())
    writer = WARCWriter(io.BytesIO(), gzip=False)
    record = writer.create_warc_record(
        redact_url(response.url),
        "response",
        payload=io.BytesIO(response.raw),
        length=len(response.raw),
        http_headers=StatusAndHeaders(status_line, headers, protocol=response.http_version),
        warc_headers_dict={
            "WARC-Date": warc_date(response.fetched_at),
            "WARC-Record-ID": f"<urn:uuid:{record_id}>",
        },
    )
    out = io.BytesIO()
    WARCWriter(out, gzip=False).write_record(record)
    return out.getvalue()


@pytest.mark.parametrize("response", RESPONSES, ids=lambda r: r.url)
def test_a_record_is_what_warcio_writes(
    response: Response, monkeypatch: pytest.MonkeyPatch
) -> None:
    record_id = uuid.UUID("12345678-1234-4678-9234-567812345678")
    monkeypatch.setattr("crawlq.crawl.warc._record_id", lambda: str(record_id))
    assert response_record(response) == _warcio_record(response, record_id)


def test_records_read_back_with_valid_digests(tmp_path: Path) -> None:
    writer = RotatingWarcWriter(tmp_path, max_file_bytes=1 << 20)
    refs = [writer.write(response) for response in RESPONSES]
    writer.close()
    for response, ref in zip(RESPONSES, refs, strict=True):
        stored = read_record(tmp_path, ref)
        assert stored.raw == response.raw
        assert stored.status == response.status
        assert stored.url == redact_url(response.url)
    with open(tmp_path / refs[0].file, "rb") as file:
        records = list(ArchiveIterator(file, check_digests=True))
    assert [r.rec_type for r in records] == ["warcinfo", "response", "response", "response"]
    for record in records:
        record.content_stream().read()
        assert record.digest_checker.passed is not False


@pytest.mark.parametrize("size", [0, 100, 600, 3_000, 20_000, 70_000])
def test_a_record_of_any_size_is_one_gzip_member_that_inflates_to_it(
    tmp_path: Path, size: int
) -> None:
    body = bytes(range(256)) * (size // 256) + b"x" * (size % 256)
    response = replace(RESPONSES[0], raw=body, body=body)
    writer = RotatingWarcWriter(tmp_path, max_file_bytes=1 << 20)
    ref = writer.write(response)
    writer.close()
    with open(tmp_path / ref.file, "rb") as file:
        file.seek(ref.offset)
        member = file.read(ref.length)
    assert gzip.decompress(member).startswith(b"WARC/1.0\r\n")
    assert read_record(tmp_path, ref).raw == body


URLS = [
    "http://site1.test/page/3", "http://site1.test:8080/page/3", "http://site1.test:80/page/3",
    "https://a.b:443/", "https://a.b:80/", "http://a.b", "http://A.b/", "http://a.b/./x",
    "http://a.b//x", "http://a.b:99999/", "http://a.b:08/", "http://a-.b/", "http://a.b./",
    "http://a.b/%41", "http://a.b/x?q", "http://a.b/~x_y-z.html", "http://a.b/.x", "http://a.b/x/",
]  # fmt: skip


@pytest.mark.parametrize("url", URLS)
def test_is_canonical_says_what_canonicalize_says(url: str) -> None:
    assert is_canonical(url) == (canonicalize(url) == url)


def test_the_guard_answers_the_same_from_its_memory() -> None:
    guard = AddressGuard(["127.0.1.0/24"])
    hosts = ["127.0.0.1", "127.0.1.5", "2130706433", "example.org", "[::ffff:10.0.0.1]"]
    first = [guard.check_literal(host) for host in hosts]
    assert [guard.check_literal(host) for host in hosts] == first
    assert first[1] is None and first[3] is None
    assert all(first[i] is not None for i in (0, 2, 4))


@given(st.binary(max_size=300), st.binary(max_size=300))
def test_a_digest_is_sha1_in_base32_as_base64_writes_it(head: bytes, body: bytes) -> None:
    expected = base64.b32encode(hashlib.sha1(head + body).digest()).decode("ascii")
    assert warc._digest(head, body) == "sha1:" + expected


def test_a_record_id_is_a_random_uuid_written_as_uuid_writes_it() -> None:
    ids = {warc._record_id() for _ in range(1000)}
    assert len(ids) == 1000
    for record_id in ids:
        parsed = uuid.UUID(record_id)
        assert str(parsed) == record_id
        assert parsed.version == 4 and parsed.variant == uuid.RFC_4122
