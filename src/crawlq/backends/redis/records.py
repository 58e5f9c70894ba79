"""Element records as the scripts store them (lua/common.lua, REC, `encode` and `decode`), for
the Python side that reads them: element lookups and the consistency check.

A record is a msgpack array holding its group as a number (names in the hash `P gn`) and its
key without the group's name where the key holds it (KEY_AT: where it was; for a URL, minus
the number of its scheme in KEY_HEADS, and the key is what follows the host without the
closing quote), PAYLOAD, PRIORITY and ATTEMPTS false when the key and 0, NEXT_PAYLOAD (the
payload of a schedule that came while the element ran) false when none came or it is the
running one's and true when it is the key, with the falses at the end left off; each lives in
one of the queue's buckets (hashes), picked by its field and the buckets' linear hashing state
(`bucket`).
"""

from __future__ import annotations

import math
from typing import Any

import msgpack

# Fields, zero-based.
(
    ID,
    GROUP,
    DUE,
    STATE,
    KEY,
    KEY_AT,
    PAYLOAD,
    PRIORITY,
    ATTEMPTS,
    LEASE,
    WORKER,
    NEXT_DUE,
    NEXT_PRIORITY,
    ERROR,
    HISTORY,
    NEXT_PAYLOAD,
) = range(16)
SIZE = 16
#: As KEY_HEADS in common.lua: a key's head stored as -1, -2.
KEY_HEADS = ('"https://', '"http://')
#: An element's field: this many bytes of its key's 64-bit digest (common.lua, `find`).
DIGEST_SIZE = 6
#: As `rank` in common.lua: due time in microseconds (7 bytes), insertion number (6 bytes).
RANK_SIZE = 13
RANK_DUE_MAX = 72057594037


def field_of(digest: int) -> bytes:
    """An element's field in its queue's buckets, from its key's signed 64-bit digest."""
    return digest.to_bytes(8, "big", signed=True)[:DIGEST_SIZE]


def rank(due: float, number: int) -> bytes:
    """Where an element ranks among its sub-queue's equal priorities, as `rank` in Lua."""
    due = min(max(due, 0.0), RANK_DUE_MAX)
    return math.floor(due * 1e6).to_bytes(7, "big") + number.to_bytes(6, "big")


def bucket(field: bytes, level: int, split: int) -> int:
    """The number of the hash holding the record of `field` when the queue's buckets are at
    `level` and `split` (its `eb` hash), as `records` in common.lua."""
    h = int.from_bytes(field[:4], "big")
    number = h % (1 << level)
    if number < split:
        number = h % (2 << level)
    return number


def unpack(raw: bytes) -> list[Any]:
    """A stored record with every field, its group still a number (look the name up, then
    `resolve`)."""
    rec: list[Any] = msgpack.unpackb(raw, raw=False)
    rec += [False] * (SIZE - len(rec))
    rec[PRIORITY], rec[ATTEMPTS] = rec[PRIORITY] or 0, rec[ATTEMPTS] or 0
    return rec


def resolve(rec: list[Any], group: str) -> list[Any]:
    """The full record from `unpack`'s, given its group's name: the name and the whole key."""
    at = rec[KEY_AT]
    if at is not False and at < 0:  # a URL's scheme, by its number in KEY_HEADS
        rec[KEY] = f'{KEY_HEADS[-at - 1]}{group}{rec[KEY]}"'
    elif at:  # a position in bytes, as Lua counts
        key = rec[KEY].encode()
        rec[KEY] = (key[: at - 1] + group.encode() + key[at - 1 :]).decode()
    rec[GROUP], rec[KEY_AT] = group, False
    return rec
