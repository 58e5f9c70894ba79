"""Name resolution: a static map (`host -> address`) first, then DNS, or nothing else.

The connector caches what this returns (its DNS cache), so a host is resolved once per TTL.
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Mapping

from aiohttp.abc import AbstractResolver, ResolveResult


def _is_address(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


class StaticResolver(AbstractResolver):
    """Answers from `mapping`; other names go to `fallback`, or fail as unknown if None."""

    def __init__(
        self, mapping: Mapping[str, str], fallback: AbstractResolver | None = None
    ) -> None:
        self.mapping = {host.lower(): address for host, address in mapping.items()}
        self.fallback = fallback

    async def resolve(
        self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET
    ) -> list[ResolveResult]:
        address = self.mapping.get(host.lower().rstrip("."))
        if address is None and _is_address(host):
            address = host
        if address is None:
            if self.fallback is None:
                raise OSError(socket.EAI_NONAME, f"{host} is not in the resolve map")
            return await self.fallback.resolve(host, port, family)
        kind = socket.AF_INET6 if ":" in address else socket.AF_INET
        return [
            ResolveResult(
                hostname=host,
                host=address,
                port=port,
                family=kind,
                proto=0,
                flags=socket.AI_NUMERICHOST,
            )
        ]

    async def close(self) -> None:
        if self.fallback is not None:
            await self.fallback.close()
