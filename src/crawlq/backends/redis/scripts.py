"""The Lua operations of the Redis backend, each run as one atomic step.

They are one Redis function library (Redis 7): `lua/common.lua` (key layout, helpers) heads
it and runs once, when the library loads; each operation's own file is the body of one
function. Run as EVAL scripts instead, common.lua's ~50 closures were built again on every
call, and a claim cost the server about a third more.

The library's name carries a digest of its code, so crawlq versions sharing a server each call
their own. A server that lost it (a restart without persistence, FUNCTION FLUSH) is given it
again by the first call that misses it.
"""

from __future__ import annotations

from functools import cache
from hashlib import sha1
from importlib import resources
from typing import Any

from redis.asyncio import Redis
from redis.exceptions import NoPermissionError, ResponseError

from .lanes import Lanes, bulk_strings

OPERATIONS = (
    "schedule",
    "claim",
    "settle",
    "heartbeat",
    "workers",
    "limits",
    "crawl_delays",
    "block",
    "reserve_send",
    "dead",
    "groups",
)


@cache
def library() -> tuple[str, str]:
    """The library's name and its code, FUNCTION LOAD's argument."""
    lua = resources.files(__package__) / "lua"
    common = (lua / "common.lua").read_text()
    bodies = {operation: (lua / f"{operation}.lua").read_text() for operation in OPERATIONS}
    digest = sha1("\0".join([common, *bodies.values()]).encode()).hexdigest()
    name = f"crawlq_{digest[:16]}"
    code = [f"#!lua name={name}", common]
    for operation, body in bodies.items():
        code.append(
            f"redis.register_function('{name}_{operation}', function(KEYS, ARGV)\n"
            f"begin(ARGV)\n{body}\nend)"
        )
    return name, "\n".join(code) + "\n"


def function_name(operation: str) -> str:
    return f"{library()[0]}_{operation}"


async def load(client: Redis) -> None:
    """Loads the library unless the server has it (then it is this very code: same name).
    A user whose ACL leaves out FUNCTION LOAD gets a NoPermissionError saying what to do."""
    untyped: Any = client  # redis-py types its asyncio commands as "awaitable or value"
    try:
        await untyped.function_load(library()[1])
    except NoPermissionError as exc:
        raise NoPermissionError(unloadable(exc)) from None
    except ResponseError as exc:
        if "already exists" not in str(exc):
            raise


def unloadable(exc: NoPermissionError) -> str:
    """Why the library is missing and cannot be loaded, and how an admin fixes that."""
    return (
        f"the crawlq function library {library()[0]} (this crawlq version's) is not loaded on "
        f"the server, and this user may not load it ({exc}): grant the user FUNCTION LOAD "
        "(ACL +function|load), or have a user who has it open this backend once with this "
        "crawlq version (any crawlq command, such as `crawlq stats --backend URL`, loads it)"
    )


def missing(exc: ResponseError) -> bool:
    """Whether a call failed only because the server does not have the library."""
    return "Function not found" in str(exc)


@cache
def command_head(operation: str, keys: tuple[str, ...], args: int) -> bytes:
    """An operation's FCALL up to its arguments, packed once, as it is the same in every call
    of a backend: packing the whole command cost ~3 us a call here, the arguments alone ~1.4."""
    return b"*%d\r\n" % (3 + len(keys) + args) + bulk_strings(
        (b"FCALL", function_name(operation), len(keys), *keys)
    )


async def call(lanes: Lanes, operation: str, keys: list[str], args: list[Any]) -> Any:
    """One operation, over the lanes; the library is loaded again first if the server lost
    it."""
    command = command_head(operation, tuple(keys), len(args)) + bulk_strings(args)
    try:
        return await lanes.call(command)
    except ResponseError as exc:
        if not missing(exc):
            raise
    await load(lanes.client)
    return await lanes.call(command)
