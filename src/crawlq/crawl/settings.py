"""How the fetcher behaves: small frozen, keyword-only value objects, one per concern."""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping
from dataclasses import dataclass, field, fields

from ..errors import ConfigError
from ..observe.logs import redact

DEFAULT_USER_AGENT = "crawlq/0.1 (+https://github.com/crawlq/crawlq)"


@dataclass(frozen=True, kw_only=True, slots=True)
class Timeouts:
    """Seconds: to connect, between two reads of the response, and for the whole request
    (its redirects included; robots.txt is a request of its own)."""

    connect: float = 10.0
    read: float = 30.0
    total: float = 60.0

    def __post_init__(self) -> None:
        if min(self.connect, self.read, self.total) <= 0:
            raise ConfigError(f"timeouts must be positive: {self}")


@dataclass(frozen=True, kw_only=True, slots=True)
class FetchSettings:
    """`proxies` with one entry is a fixed egress proxy; with several, requests rotate over
    them. `resolve` maps host names to addresses before DNS is asked; `resolve_only` refuses
    every name not in it (a crawl that must never leave a private network).

    `allow_networks` lists the CIDR blocks a request may reach although they are private,
    loopback, link-local or otherwise not public (the SSRF guard refuses those by default):
    `("127.0.0.0/8",)` for a crawl of local test servers, `("10.0.0.0/8",)` for an
    intranet."""

    user_agent: str = DEFAULT_USER_AGENT
    timeouts: Timeouts = field(default_factory=Timeouts)
    max_redirects: int = 10
    max_bytes: int = 10 * 2**20
    proxies: tuple[str, ...] = ()
    resolve: Mapping[str, str] = field(default_factory=dict)
    resolve_only: bool = False
    dns_ttl: int = 300
    connections: int = 1000
    verify_tls: bool = True
    ca_file: str | None = None  # a CA bundle to verify certificates with (system CAs if None)
    robots: bool = True
    robots_ttl: float = 24 * 3600.0
    robots_retry: float = 60.0  # a site whose robots.txt is unreachable is paused this long
    max_crawl_delay: float = 60.0
    allow_networks: tuple[str, ...] = ()

    def __repr__(self) -> str:
        """A dataclass's repr, the proxies' credentials masked: settings get logged, and
        shown with a traceback's locals."""
        shown = ", ".join(f"{f.name}={getattr(self, f.name)!r}" for f in fields(self))
        return redact(f"{type(self).__name__}({shown})")

    def __post_init__(self) -> None:
        if self.max_redirects < 0:
            raise ConfigError(f"max_redirects must be >= 0, got {self.max_redirects}")
        if self.max_bytes < 1:
            raise ConfigError(f"max_bytes must be positive, got {self.max_bytes}")
        if not self.robots_retry > 0:
            raise ConfigError(f"robots_retry must be positive, got {self.robots_retry}")
        if not self.robots_ttl > 0:  # inf: robots.txt read once for good
            raise ConfigError(f"robots_ttl must be positive, got {self.robots_ttl}")
        if self.connections < 1:
            raise ConfigError(f"connections must be positive, got {self.connections}")
        for network in self.allow_networks:
            try:
                ipaddress.ip_network(network, strict=False)
            except ValueError:
                raise ConfigError(f"allow_networks: {network!r} is not a CIDR block") from None
        for proxy in self.proxies:
            if not proxy.startswith(("http://", "https://")):
                raise ConfigError(f"proxy {redact(proxy)!r} must be an http:// or https:// URL")
