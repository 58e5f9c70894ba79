"""The SSRF guard: requests reach public addresses only, and the networks explicitly allowed.

A crawler follows links that strangers wrote, so a page (or a redirect, or a DNS answer) can
point it at the machine's own services, the intranet or the cloud metadata service. Every
address that is not globally routable is refused unless it is inside `allow_networks`:
private (10/8, 172.16/12, 192.168/16, fc00::/7), loopback, link-local (169.254/16 with the
metadata address 169.254.169.254, fe80::/10), unspecified, multicast, reserved, shared
(100.64/10), and IPv6 forms that carry one of these (::ffff:10.0.0.1, 6to4, NAT64).

The check is made where the address is certain:

- a name: by `GuardedResolver`, the resolver of the fetcher's connector, on every resolution.
  The connector connects only to the addresses it returns, so a name that resolves to a
  private address, or turns into one later (DNS rebinding), is refused at connect time;
- a literal address in a URL, in every spelling the C library accepts (2130706433, 0x7f.1,
  127.1, [::ffff:127.0.0.1]): by the fetcher before each hop (aiohttp connects to literals
  without asking the resolver);
- through a proxy, which resolves and connects on its own: the fetcher resolves the target
  with its resolver first and refuses the same way. Residual risk: the proxy may get another
  answer than we did (its own DNS, or a record changed between the two lookups); only a
  proxy that enforces the same policy closes that gap.
"""

from __future__ import annotations

import ipaddress
import re
import socket
from collections.abc import Iterable

from aiohttp.abc import AbstractResolver, ResolveResult

Address = ipaddress.IPv4Address | ipaddress.IPv6Address
Network = ipaddress.IPv4Network | ipaddress.IPv6Network

_SHARED = ipaddress.IPv4Network("100.64.0.0/10")
_PRIVATE = tuple(
    ipaddress.ip_network(n) for n in ("10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "fc00::/7")
)
_NAT64 = ipaddress.IPv6Network("64:ff9b::/96")
_METADATA = frozenset(
    {ipaddress.ip_address("169.254.169.254"), ipaddress.ip_address("fd00:ec2::254")}
)
#: What inet_aton reads as an IPv4 address besides the dotted quad: 2130706433, 0x7f.1, 0177.1.
#: How many hosts' `check_literal` answers a guard remembers.
MAX_LITERAL_VERDICTS = 10_000
_LEGACY_IPV4 = re.compile(r"[0-9][0-9a-fA-FxX.]*")


class BlockedAddress(OSError):
    """The address a request would reach is refused by the guard (an OSError, so that
    aiohttp passes it on from the resolver like any resolution failure)."""


def literal_address(host: str) -> Address | None:
    """`host` as an address if it spells one (brackets, zone, trailing dot and the legacy
    IPv4 forms included); None for a name."""
    text = host.strip().removeprefix("[").removesuffix("]").split("%", 1)[0].rstrip(".")
    try:
        return ipaddress.ip_address(text)
    except ValueError:
        pass
    if not _LEGACY_IPV4.fullmatch(text):
        return None
    try:
        return ipaddress.IPv4Address(socket.inet_aton(text))
    except OSError:
        return None


def _targets(address: Address) -> tuple[Address, ...]:
    """What to check of `address`: an IPv6 address carrying an IPv4 one leads to it (mapped
    ::ffff:a.b.c.d and NAT64 64:ff9b::/96 only to it, 6to4 through a relay as well)."""
    if isinstance(address, ipaddress.IPv6Address):
        if address.ipv4_mapped is not None:
            return (address.ipv4_mapped,)
        if address in _NAT64:
            return (ipaddress.IPv4Address(int(address) & 0xFFFFFFFF),)
        if address.sixtofour is not None:
            return (address, address.sixtofour)
    return (address,)


def _kind(address: Address) -> str | None:
    """What makes `address` non-public, or None if it is public."""
    if address.is_unspecified:
        return "an unspecified address"
    if address.is_loopback:
        return "a loopback address"
    if address in _METADATA:
        return "the cloud metadata address"
    if address.is_link_local:
        return "a link-local address"
    if isinstance(address, ipaddress.IPv4Address) and address in _SHARED:
        return "a shared address (carrier-grade NAT)"
    if address.is_multicast:
        return "a multicast address"
    if any(address in network for network in _PRIVATE if network.version == address.version):
        return "a private address"
    if address.is_reserved:
        return "a reserved address"
    if not address.is_global:
        return "a special-purpose address"
    return None


class AddressGuard:
    """Decides which addresses a request may reach: public ones, and those in `allow`."""

    def __init__(self, allow: Iterable[str] = ()) -> None:
        self.allow: tuple[Network, ...] = tuple(
            ipaddress.ip_network(network, strict=False) for network in allow
        )
        self._literal_verdicts: dict[str, str | None] = {}  # host -> check_literal's answer

    def allowed(self, address: Address) -> bool:
        return any(
            address in network for network in self.allow if network.version == address.version
        )

    def refusal(self, address: Address | str, host: str | None = None) -> str | None:
        """Why a request to `address` (resolved from `host`) is refused; None if it may go."""
        if isinstance(address, str):
            address = ipaddress.ip_address(address.split("%", 1)[0])
        if self.allowed(address):
            return None
        for target in _targets(address):
            kind = None if self.allowed(target) else _kind(target)
            if kind is None:
                continue
            shown = str(address) if target == address else f"{address} ({target})"
            if host is None or literal_address(host) is not None:
                what = f"{shown} is {kind}"
            else:
                what = f"{host} resolves to {shown}, {kind}"
            return f"refused: {what}; allow it with allow_networks (--allow-network)"
        return None

    def check_literal(self, host: str) -> str | None:
        """The refusal for a host that spells an address; None for a name or an allowed one.
        Answers are remembered per host (they depend on nothing else): a crawl asks about
        the same few hosts for every page."""
        try:
            return self._literal_verdicts[host]
        except KeyError:
            pass
        address = literal_address(host)
        verdict = None if address is None else self.refusal(address, host)
        if len(self._literal_verdicts) >= MAX_LITERAL_VERDICTS:
            self._literal_verdicts.clear()
        self._literal_verdicts[host] = verdict
        return verdict


class GuardedResolver(AbstractResolver):
    """Resolves with `inner`, then keeps only the addresses `guard` allows; BlockedAddress if
    none is left. Names in `exempt` (the configured proxies: the operator chose them) pass."""

    def __init__(
        self, inner: AbstractResolver, guard: AddressGuard, exempt: Iterable[str] = ()
    ) -> None:
        self.inner = inner
        self.guard = guard
        self.exempt = frozenset(name.lower().rstrip(".") for name in exempt)

    async def resolve(
        self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET
    ) -> list[ResolveResult]:
        results = await self.inner.resolve(host, port, family)
        if host.lower().rstrip(".") in self.exempt:
            return results
        kept, refusals = [], []
        for result in results:
            refusal = self.guard.refusal(result["host"], host)
            if refusal is None:
                kept.append(result)
            else:
                refusals.append(refusal)
        if not kept:
            raise BlockedAddress(refusals[0] if refusals else f"refused: {host} has no address")
        return kept

    async def close(self) -> None:
        await self.inner.close()
