"""Fetch failures as data: every way a page can fail has a `Reason`, and a policy says
whether it is worth retrying.

    CrawlqError
    └── FetchError          a URL could not be fetched; `reason`, `url`, the hops received
        └── Throttled       the server asked us to wait (429/503 Retry-After); `until`
"""

from __future__ import annotations

from collections.abc import Sequence
from enum import StrEnum
from typing import TYPE_CHECKING

from ..errors import CrawlqError
from .redact import redact_text

if TYPE_CHECKING:
    from .response import Response


class Reason(StrEnum):
    DNS = "dns_failure"
    REFUSED = "connection_refused"
    CONNECT = "connection_failed"
    TLS = "tls_error"
    TIMEOUT = "timeout"
    TOO_LARGE = "too_large"
    BAD_ENCODING = "bad_encoding"
    BROKEN_BODY = "broken_body"
    BAD_RESPONSE = "bad_response"  # not HTTP: a bad status line, headers too big or wrong
    REDIRECT_LOOP = "redirect_loop"
    TOO_MANY_REDIRECTS = "too_many_redirects"
    ROBOTS_DISALLOWED = "robots_disallowed"
    ROBOTS_UNAVAILABLE = "robots_unavailable"
    OUT_OF_SCOPE = "out_of_scope"
    SERVER_ERROR = "server_error"
    THROTTLED = "throttled"
    LOGIN_FAILED = "login_failed"
    NETWORK = "network_error"
    PROXY = "proxy_unreachable"  # no proxy of the fetcher's could be reached (proxies.py)
    BLOCKED = "blocked_address"  # the SSRF guard refused the address (guard.py)
    BROWSER_UNAVAILABLE = "browser_unavailable"  # no Chromium, or Playwright could not start it
    BROWSER_FAILED = "browser_failed"  # Chromium crashed or broke off while rendering
    # A crawl's page redirected to another host: that URL becomes a page of its own, to go
    # when its host's limits allow (crawler.py). Not an error of the page.
    OTHER_HOST = "redirect_to_other_host"


#: Worth another attempt later: the cause is on the network or the server, and passes.
TRANSIENT = frozenset(
    {
        Reason.DNS,
        Reason.REFUSED,
        Reason.CONNECT,
        Reason.TIMEOUT,
        Reason.BROKEN_BODY,
        Reason.ROBOTS_UNAVAILABLE,
        Reason.SERVER_ERROR,
        Reason.LOGIN_FAILED,
        Reason.NETWORK,
        Reason.PROXY,
        Reason.BROWSER_FAILED,
    }
)

#: Count toward backing a whole host off: the host itself is struggling.
HOST_TROUBLE = frozenset({Reason.TIMEOUT, Reason.SERVER_ERROR, Reason.REFUSED, Reason.CONNECT})


class FetchError(CrawlqError):
    """`url` could not be fetched for `reason`; `responses` holds the hops received first.
    The message and `detail` never show a URL's credentials (they end up in logs, page
    records and dead letters); `url` is the URL as given. `until` (epoch seconds): not worth
    trying the host again before then (its robots.txt is unreachable until it is asked
    again)."""

    def __init__(
        self,
        reason: Reason,
        url: str,
        detail: str = "",
        *,
        responses: Sequence[Response] = (),
        until: float | None = None,
    ) -> None:
        detail = redact_text(detail)
        super().__init__(f"{reason.value}: {redact_text(url)}{f': {detail}' if detail else ''}")
        self.reason = reason
        self.url = url
        self.detail = detail
        self.responses = tuple(responses)
        self.until = until

    @property
    def transient(self) -> bool:
        return self.reason in TRANSIENT


class Throttled(FetchError):
    """Not now: its group is blocked until `until` (epoch seconds). `answered`: the server
    said so (429/503 with Retry-After); otherwise the page was held back before sending (its
    host paused, or its turn too far off)."""

    def __init__(
        self,
        url: str,
        until: float,
        detail: str,
        *,
        responses: Sequence[Response] = (),
        answered: bool = False,
    ) -> None:
        super().__init__(Reason.THROTTLED, url, detail, responses=responses, until=until)
        self.until: float = until
        self.answered = answered
