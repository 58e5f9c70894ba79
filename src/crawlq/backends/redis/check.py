"""Verifies every internal invariant of a Redis namespace; for tests and `crawlq check`.

Reads the whole namespace (redis-py's asyncio client, typed Any: its hash commands are typed
"awaitable or value"), so run it on a quiet queue (workers stopped): a change made while
it reads can show up as a false alarm, never hide a real one for long.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from . import records
from .records import (
    DIGEST_SIZE,
    DUE,
    GROUP,
    ID,
    KEY,
    LEASE,
    NEXT_DUE,
    NEXT_PAYLOAD,
    NEXT_PRIORITY,
    RANK_SIZE,
    STATE,
    WORKER,
)

NEVER = 1e300
DELAYED, READY, RUNNING = 0, 1, 2


def _glob_literal(text: str) -> str:
    """`text` as a Redis glob matching only itself."""
    return "".join("\\" + ch if ch in "*?[]^\\" else ch for ch in text)


def _lease_member(queue: str, field: bytes) -> bytes:
    name = queue.encode()
    return str(len(name)).encode() + b":" + name + field


def _gate(group: dict[bytes, bytes]) -> float:
    concurrency = group.get(b"c")
    running = int(group.get(b"r", 0))
    if concurrency is not None and running >= int(concurrency):
        return NEVER
    at = 0.0
    if b"ls" in group:
        at = float(group[b"ls"]) + float(group.get(b"i", 0))
    return max(at, float(group.get(b"bu", 0)))


async def check(client: Any, prefix: str, now: float) -> list[str]:
    """Every broken invariant, as a sentence; empty when the namespace is consistent."""
    problems: list[str] = []
    queues = [name.decode() for name in await client.hkeys(prefix + "queues")]
    groups = {}  # every group's hash, as found by its key
    group_keys = _glob_literal(prefix + "g:") + "*"
    async for name in client.scan_iter(match=group_keys, count=1000):
        groups[name.decode()[len(prefix) + 2 :]] = await client.hgetall(name)
    leases = dict(await client.zrange(prefix + "leases", 0, -1, withscores=True))
    queued_by_group: Counter[str] = Counter()
    running_by_group: Counter[str] = Counter()
    waiting_by_group: Counter[str] = Counter()  # queues with the group's row waiting
    held_by_worker: dict[str, set[bytes]] = {}
    seen_leases: set[bytes] = set()

    def key(queue: str, kind: str) -> str:
        return f"{prefix}q:{len(queue.encode())}:{queue}:{kind}"

    names = {int(n): g.decode() for n, g in (await client.hgetall(prefix + "gn")).items()}
    problems += _check_group_numbers(groups, names)
    for queue in queues:
        stored = {}
        level, split, collisions = (
            int(n or 0) for n in await client.hmget(key(queue, "eb"), ["l", "s", "c"])
        )
        shared = await client.scard(key(queue, "ec"))
        if collisions != shared:
            problems.append(f"{queue}: counts {collisions} shared digests, the set holds {shared}")
        buckets = key(queue, "e:")
        async for name in client.scan_iter(match=_glob_literal(buckets) + "*", count=1000):
            bucket = name.decode()[len(buckets) :]
            for field, raw in (await client.hgetall(name)).items():
                stored[field] = raw
                if str(records.bucket(field, level, split)) != bucket:
                    problems.append(f"{queue}: field {field!r} is in bucket {bucket}")
        delayed = dict(await client.zrange(key(queue, "d"), 0, -1, withscores=True))
        counts = {int(k): int(v) for k, v in (await client.hgetall(key(queue, "n"))).items()}
        state_counts: Counter[int] = Counter()
        ready_members: dict[str, set[bytes]] = {}
        for field, raw in stored.items():
            rec = records.unpack(raw)
            number = rec[GROUP]
            if number and number not in names:
                problems.append(f"{queue}: field {field!r} holds an unknown group number")
                continue
            rec = records.resolve(rec, names[number] if number else "")
            state, group = rec[STATE], rec[GROUP]
            state_counts[state] += 1
            where = f"{queue}/{rec[KEY]}"
            if len(field) != DIGEST_SIZE and field[DIGEST_SIZE:].decode() != rec[KEY]:
                problems.append(f"{where}: field does not match its key")
            if state == DELAYED:
                if delayed.get(field) != float(rec[DUE]):
                    problems.append(f"{where}: delayed but not in the delayed set at its due time")
            elif state == READY:
                ready_members.setdefault(group, set()).add(
                    records.rank(float(rec[DUE]), rec[ID]) + field
                )
            elif state == RUNNING:
                member = _lease_member(queue, field)
                seen_leases.add(member)
                if leases.get(member) != float(rec[LEASE]):
                    problems.append(f"{where}: running but its lease is not in the lease set")
                if rec[WORKER]:
                    held_by_worker.setdefault(rec[WORKER], set()).add(member)
            else:
                problems.append(f"{where}: unknown state {state}")
            if (rec[NEXT_DUE] is False) != (rec[NEXT_PRIORITY] is False) or (
                rec[NEXT_DUE] is False and rec[NEXT_PAYLOAD] is not False
            ):
                problems.append(f"{where}: a schedule remembered for after its run is incomplete")
            elif rec[NEXT_DUE] is not False and state != RUNNING:
                problems.append(f"{where}: a schedule remembered for after its run, not running")
            if state in (DELAYED, READY):
                queued_by_group[group] += 1
            elif state == RUNNING:
                running_by_group[group] += 1
        if len(delayed) != state_counts[DELAYED]:
            problems.append(
                f"{queue}: {len(delayed)} in the delayed set, "
                f"{state_counts[DELAYED]} delayed records"
            )
        for state in (DELAYED, READY, RUNNING):
            if counts.get(state, 0) != state_counts[state]:
                problems.append(
                    f"{queue}: count of state {state} is {counts.get(state, 0)}, "
                    f"records say {state_counts[state]}"
                )
        dead = await client.hlen(key(queue, "x"))
        if counts.get(3, 0) != dead or await client.zcard(key(queue, "xo")) != dead:
            problems.append(f"{queue}: dead count {counts.get(3, 0)}, {dead} dead letters")
        problems += await _check_frontier(client, queue, key, ready_members, groups, now)
        for group in await client.zrange(key(queue, "fw"), 0, -1):
            waiting_by_group[group.decode()] += 1
    for member in set(leases) - seen_leases:
        problems.append(f"lease {member!r} belongs to no running element")
    for name, group in groups.items():
        if (
            int(group.get(b"q", 0)) != queued_by_group[name]
            or int(group.get(b"r", 0)) != running_by_group[name]
        ):
            problems.append(
                f"group {name}: counts queued {int(group.get(b'q', 0))} "
                f"running {int(group.get(b'r', 0))}, "
                f"elements say {queued_by_group[name]} and {running_by_group[name]}"
            )
        if int(group.get(b"w", 0)) != waiting_by_group[name]:
            problems.append(
                f"group {name}: counts {int(group.get(b'w', 0))} waiting rows, "
                f"the frontiers hold {waiting_by_group[name]}"
            )
    busy = {g.decode(): s for g, s in await client.zrange(prefix + "busy", 0, -1, withscores=True)}
    expected = {
        name: -(running_by_group[name] * 2**32 + queued_by_group[name])
        for name in groups
        if running_by_group[name] or queued_by_group[name]
    }
    if busy != expected:
        problems.append(f"busy-group index {busy}, elements say {expected}")
    held = {}
    async for name in client.scan_iter(match=_glob_literal(prefix) + "w:*", count=1000):
        members = await client.smembers(name)
        if members:
            held[name.decode()[len(prefix) + 2 :]] = set(members)
    if held != held_by_worker:
        problems.append(f"elements held per worker {held}, records say {held_by_worker}")
    return problems


def _check_group_numbers(groups: dict[str, dict[bytes, bytes]], names: dict[int, str]) -> list[str]:
    problems = []
    for name, group in groups.items():
        number = group.get(b"id")
        if number is None or names.get(int(number)) != name:
            problems.append(f"group {name}: number {number!r}, the number index says otherwise")
    if len(names) != len(groups):
        problems.append(f"{len(names)} group numbers for {len(groups)} groups")
    return problems


async def _check_frontier(
    client: Any,
    queue: str,
    key: Any,
    ready_members: dict[str, set[bytes]],
    groups: dict[str, dict[bytes, bytes]],
    now: float,
) -> list[str]:
    problems = []
    rows = {g.decode(): m for g, m in (await client.hgetall(key(queue, "fr"))).items()}
    active = dict(await client.zrange(key(queue, "fa"), 0, -1, withscores=True))
    waiting = {
        g.decode(): s for g, s in await client.zrange(key(queue, "fw"), 0, -1, withscores=True)
    }
    sub_queues = {}
    for group, members in ready_members.items():
        stored = await client.zrange(key(queue, "r:" + group), 0, -1, withscores=True)
        if {m for m, _ in stored} != members:
            problems.append(f"{queue}/{group}: sub-queue does not hold exactly its ready elements")
        sub_queues[group] = stored
    for group in set(rows) | set(sub_queues) | set(waiting):
        stored = sub_queues.get(group, [])
        row = rows.get(group)
        where = f"{queue}/{group or '(no group)'}"
        if not stored:
            if row is not None or group in waiting:
                problems.append(f"{where}: a frontier row for an empty sub-queue")
            continue
        if row is None:
            problems.append(f"{where}: ready elements but no frontier row")
            continue
        gate = _gate(groups.get(group, {})) if group else 0.0
        head, score = stored[0]
        if row:
            if row != head[:RANK_SIZE] + group.encode() or active.get(row) != score:
                problems.append(f"{where}: active row does not show its head")
            if gate > now:
                problems.append(f"{where}: active while its group is closed until {gate}")
            if group in waiting:
                problems.append(f"{where}: both active and waiting")
        elif (waits := waiting.get(group)) is None or (waits > gate and waits > now):
            # Earlier than the gate is harmless: a claim then finds the row due and files it
            # anew (a claim in another queue of the group moves the gate, not this row).
            problems.append(f"{where}: waiting for {waits}, its gate is {gate}")
    if len(active) != sum(1 for m in rows.values() if m):
        problems.append(f"{queue}: active rows and the row index disagree")
    return problems
