"""A fetched HTTP response: what the server sent, as sent, and its body decoded."""

from __future__ import annotations

import re
from dataclasses import dataclass

from ..observe.logs import redact
from .decoding import decode_text

_CHARSET = re.compile(r"charset\s*=\s*[\"']?([A-Za-z0-9._:-]+)", re.IGNORECASE)

REDIRECT_STATUSES = frozenset({301, 302, 303, 307, 308})


@dataclass(frozen=True, kw_only=True, slots=True)
class Response:
    """One hop. `raw` is the body as it came over the wire (still compressed if the server
    compressed it), `body` the same after Content-Encoding is undone. `history` holds the
    redirects that led here, oldest first."""

    url: str
    status: int
    reason: str
    http_version: str
    headers: tuple[tuple[str, str], ...]
    raw: bytes
    body: bytes
    fetched_at: float
    elapsed: float
    history: tuple[Response, ...] = ()

    def __repr__(self) -> str:
        """Short, and without credentials: a response gets logged, and shown in tracebacks
        and test failures, where a dataclass's repr wrote every header (Set-Cookie's session
        included), the URL's user:password and the whole body."""
        count = len(self.history)
        hops = f", after {count} redirect{'s' if count > 1 else ''}" if count else ""
        return f"<Response {self.status} {redact(self.url)} ({len(self.body)} bytes{hops})>"

    def header(self, name: str) -> str | None:
        wanted = name.lower()
        for key, value in self.headers:
            if key.lower() == wanted:
                return value
        return None

    @property
    def content_type(self) -> str:
        value = self.header("Content-Type") or ""
        return value.split(";", 1)[0].strip().lower()

    @property
    def is_html(self) -> bool:
        return self.content_type in ("text/html", "application/xhtml+xml")

    @property
    def is_redirect(self) -> bool:
        return self.status in REDIRECT_STATUSES and self.header("Location") is not None

    @property
    def declared_charset(self) -> str | None:
        match = _CHARSET.search(self.header("Content-Type") or "")
        return match.group(1) if match else None

    def text(self) -> str:
        """The body as text; FetchError(BAD_ENCODING) if no charset decodes it."""
        return decode_text(self.body, self.declared_charset, self.url, html=self.is_html)

    @property
    def chain(self) -> tuple[Response, ...]:
        """Every hop, this one last."""
        return (*self.history, self)
