"""The Lua scripts of the Redis backend, each run as one atomic step.

Every script is `lua/common.lua` (key layout, helpers) followed by the operation's own file;
redis-py runs them by SHA and loads them again after a server restart (NOSCRIPT).
"""

from __future__ import annotations

from functools import cache
from importlib import resources

from redis.asyncio import Redis
from redis.commands.core import AsyncScript

OPERATIONS = (
    "schedule",
    "claim",
    "settle",
    "heartbeat",
    "workers",
    "limits",
    "block",
    "reserve_send",
    "dead",
    "groups",
)


@cache
def source(name: str) -> str:
    lua = resources.files(__package__) / "lua"
    return (lua / "common.lua").read_text() + "\n" + (lua / f"{name}.lua").read_text()


def register(client: Redis) -> dict[str, AsyncScript]:
    return {name: client.register_script(source(name)) for name in OPERATIONS}
