"""The queue operations on one SQLite store, synchronous; each one is a single transaction.

The frontier (see migrations/0001) is kept true by two refreshes: `_refresh_pair` after the
ready elements of a (queue, group) sub-queue change, and `_refresh_gate` after a group's
running count, start time, limits or block change.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from fnmatch import fnmatchcase
from typing import Any, NamedTuple

from ...errors import UnknownQueue
from ...identity import key_hash
from ...limits import UNLIMITED, at_least, is_exact, merged, resolve_indexed
from ...observe.logs import redact
from ...types import (
    NEVER,
    Attempt,
    Claimed,
    ClaimResult,
    DeadLetter,
    ElementInfo,
    Failure,
    GroupBy,
    GroupStats,
    Leases,
    Limit,
    LimitRule,
    Mode,
    Origin,
    QueueConfig,
    QueueStats,
    Schedule,
    ScheduleResult,
    WorkerInfo,
    lease_of,
)
from ...writelock import TurnTaken
from ..base import WORKER_TTL
from ..batch import merge
from ..views import dead_element, live_element
from .globs import sqlite_glob
from .store import Store

DELAYED, READY, RUNNING, DEAD = 0, 1, 2, 3
NO_GROUP_ID = 0
#: The schema that moved Crawl-delays out of the rules: a database migrated from before it has
#: its groups' stored limits resolved again.
MIGRATED_DELAYS = 9
#: Group ids and names a process keeps at most: a crawl meets millions of hosts, most once.
GROUP_CACHE_SIZE = 50_000

Pair = tuple[int, int]


class BatchRow(NamedTuple):
    """One element for the batch statements, in the column order of `batch_add`."""

    queue_id: int
    key: str
    payload: str | None
    group_id: int
    due: float
    priority: int
    mode: int
    h: int
    check_seen: bool
    part: int = 0  # the index of its batch among those applied together


#: What lookup_lease returns: queue_id, group_id, state, next_due, next_priority, seen, h.
Lease = tuple[int, int, int, float | None, int | None, int, int]


class _Queue:
    __slots__ = ("id", "seen")

    def __init__(self, queue_id: int, seen: bool) -> None:
        self.id = queue_id
        self.seen = seen


def attempts_of(history: str | None) -> tuple[Attempt, ...]:
    """The stored JSON history as Attempt values."""
    return tuple(
        Attempt(attempt=n, claimed_at=at, worker=worker or "", outcome=outcome)
        for n, at, worker, outcome in json.loads(history or "[]")
    )


def _dead_letter(queue: str, row: Sequence[Any]) -> DeadLetter:
    """A row of `dead_list` or `dead_by_key` (key, payload, group, attempts, error, traceback,
    died at) as a DeadLetter; credentials in the error and traceback masked (workers store
    them masked, but not the letters stored before they did)."""
    key, payload, group, attempts, error, tb, died = row
    return DeadLetter(
        queue=queue,
        key=key,
        payload=payload,
        group=group,
        attempts=attempts,
        error=redact(error) if error else error,
        traceback=redact(tb) if tb else tb,
        died_at=died,
    )


class Engine:
    def __init__(self, store: Store, clock: Callable[[], float]) -> None:
        self.store = store
        self.clock = clock
        self._queues: dict[str, _Queue] = {}
        self._groups: dict[str, int] = {}
        self._group_names: dict[int, str] = {}
        self._forget_groups()
        if store.migrated_from is not None and store.migrated_from < MIGRATED_DELAYS:
            with store.transaction():
                self._follow_limits(list(self.crawl_delays()), clock())

    # -- names to ids ---------------------------------------------------------------------

    def _queue(self, name: str) -> _Queue | None:
        queue = self._queues.get(name)
        if queue is None:
            row = self.store.run("queue_by_name", {"name": name}).fetchone()
            if row is None:
                return None
            queue = self._queues[name] = _Queue(row[0], bool(row[3]))
        return queue

    def _group_id(self, name: str, rules: _Rules) -> int:
        group_id = self._groups.get(name)
        if group_id is None:
            group_id = self.store.value("group_by_name", {"name": name})
            if group_id is None:
                limit = rules.resolve(name)
                group_id = self.store.value(
                    "group_insert",
                    {"name": name, "concurrency": limit.concurrency, "interval": limit.interval},
                )
            if len(self._groups) >= GROUP_CACHE_SIZE:
                self._forget_groups()
            self._groups[name] = group_id
            self._group_names[group_id] = name
        return int(group_id)

    def _forget_groups(self) -> None:
        self._groups = {"": NO_GROUP_ID}
        self._group_names = {NO_GROUP_ID: ""}

    def _group_name(self, group_id: int) -> str:
        name = self._group_names.get(group_id)
        if name is None:
            if len(self._group_names) >= GROUP_CACHE_SIZE:
                self._forget_groups()
            name = self._group_names[group_id] = self.store.value(
                "group_name", {"group_id": group_id}
            )
        return name

    # -- frontier upkeep -------------------------------------------------------------------

    def _refresh_pair(self, pair: Pair, now: float) -> None:
        params = {"queue_id": pair[0], "group_id": pair[1], "now": now}
        if self.store.run("refresh_pair", params).rowcount == 0:
            self.store.run("drop_pair", params)

    def _refresh_gate(self, group_id: int, now: float) -> set[int]:
        """Returns the queues whose sub-queues wait on the group, i.e. who cares."""
        params = {"group_id": group_id, "now": now}
        return {queue_id for (queue_id,) in self.store.run("refresh_gate", params)}

    def _settle(self, pairs: set[Pair], gates: set[int], now: float) -> set[int]:
        """Refreshes what changed; returns the queues in which a group with waiting work
        changed its gate or a sub-queue its head."""
        opened = {queue_id for queue_id, _ in pairs}
        for group_id in gates:
            if group_id != NO_GROUP_ID:
                opened |= self._refresh_gate(group_id, now)
        for pair in pairs:
            self._refresh_pair(pair, now)
        return opened

    # -- queues ----------------------------------------------------------------------------

    def ensure_queues(self, configs: Sequence[QueueConfig]) -> None:
        with self.store.transaction():
            for config in configs:
                queue_id = self.store.value(
                    "queue_upsert",
                    {
                        "name": config.name,
                        "group_by": config.group_by.value,
                        "custom_key": int(config.custom_key),
                        "seen": int(config.seen),
                    },
                )
                self.store.run("queue_counts_init", {"queue_id": queue_id})
                self._queues[config.name] = _Queue(queue_id, config.seen)

    def queues(self) -> list[QueueConfig]:
        return [
            QueueConfig(name=name, group_by=GroupBy(by), custom_key=bool(custom), seen=bool(seen))
            for _, name, by, custom, seen in self.store.run("queues_all")
        ]

    # -- schedule --------------------------------------------------------------------------

    def schedule(self, items: Sequence[Schedule]) -> tuple[ScheduleResult, list[str]]:
        """Applies a batch; returns what happened and whom to wake."""
        results, wake = self.schedule_batches([items])
        return results[0], wake

    def schedule_batches(
        self, batches: Sequence[Sequence[Schedule]]
    ) -> tuple[list[ScheduleResult], list[str]]:
        """Applies batches one after the other, in one transaction (all or none): what each
        would have done on its own, and whom to wake."""
        try:
            with self.store.transaction():
                results = self._schedule_in_turn(batches)
                changed: set[int] = set()
                for items, result in zip(batches, results, strict=True):
                    changed |= self._scheduled_queues(items, result)
                wake = self._wake_addresses(changed)
        except TurnTaken:
            raise  # before the transaction began: nothing to undo
        except BaseException:
            self._forget_groups()  # ids it cached may be of groups it inserted, now undone
            raise
        return results, wake

    def _schedule_in_turn(self, batches: Sequence[Sequence[Schedule]]) -> list[ScheduleResult]:
        """Batches in turn. Those that share no element cannot see each other's work, so a
        run of them goes through the batch statements together: a crawl's group commit
        brings dozens of pages' few links each, and each pass costs a dozen statements."""
        if len(batches) == 1:  # a bulk schedule: no need to know its keys
            return [self._schedule(batches[0])]
        results: list[ScheduleResult] = []
        run: list[list[Schedule]] = []
        slots: set[tuple[str, str]] = set()
        for items in batches:
            rounds = merge(items)
            mine = {(item.queue, item.key) for item in rounds[0]}
            if len(rounds) > 1 or not slots.isdisjoint(mine):
                results += self._schedule_once(run) if run else []
                run, slots = [], set()
            if len(rounds) > 1:
                results.append(self._schedule_rounds(rounds))
            else:
                run.append(rounds[0])
                slots |= mine
        return results + (self._schedule_once(run) if run else [])

    def _scheduled_queues(self, items: Sequence[Schedule], result: ScheduleResult) -> set[int]:
        """The queues a schedule gave claimable work, or an earlier due time, to wake for."""
        if not (result.added or result.moved):
            return set()
        return {self._queues[name].id for name in {item.queue for item in items}}

    def _schedule(self, items: Sequence[Schedule]) -> ScheduleResult:
        return self._schedule_rounds(merge(items))

    def _schedule_rounds(self, rounds: list[list[Schedule]]) -> ScheduleResult:
        result = ScheduleResult()
        for round_ in rounds:
            result += self._schedule_once([round_])[0]
        return result

    def _schedule_once(self, parts: Sequence[Sequence[Schedule]]) -> list[ScheduleResult]:
        """Batches that share no element, each holding an element once: what each did."""
        now = self.clock()
        rules = _Rules(self.store)
        names = {item.queue for batch in parts for item in batch}
        queues = {name: self._queue(name) for name in names}
        groups = self._groups
        rows = []
        for part, batch in enumerate(parts):
            for item in batch:
                queue = queues[item.queue]
                if queue is None:
                    raise UnknownQueue(item.queue)
                group_id = groups.get(item.group)
                if group_id is None:
                    group_id = self._group_id(item.group, rules)
                rows.append(
                    BatchRow(
                        queue.id,
                        item.key,
                        item.payload,
                        group_id,
                        item.due,
                        item.priority,
                        item.mode.value,
                        key_hash(item.key),
                        queue.seen and not item.revisit,
                        part,
                    )
                )
        counts = self._apply_batch(rows, now, len(parts))
        return [
            ScheduleResult(
                added=added,
                moved=moved,
                deferred=deferred,
                skipped_seen=skipped,
                kept=len(batch) - skipped - added - moved - deferred,
            )
            for batch, (skipped, deferred, moved, added) in zip(parts, counts, strict=True)
        ]

    def _apply_batch(self, rows: Sequence[BatchRow], now: float, parts: int = 1) -> list[list[int]]:
        """Applies a batch in one statement each; returns skipped, deferred, moved, added for
        each of its `parts` (rows say which they belong to). A batch of keys none of which is
        queued (the usual one: new links) skips the statements that change queued elements."""
        store = self.store
        counts = [[0, 0, 0, 0] for _ in range(parts)]
        store.run("batch_clear")
        store.many("batch_add", rows)
        queued = store.run("batch_classify").rowcount  # keys in the queue, in any state
        if any(row.check_seen for row in rows):
            for (part,) in store.run("batch_drop_seen").fetchall():
                counts[part][0] += 1
        if queued:
            part_of = dict(store.run("batch_queued_parts").fetchall()) if parts > 1 else {}
            for (element_id,) in store.run("batch_defer_running").fetchall():
                counts[part_of.get(element_id, 0)][1] += 1
            store.run("batch_touch_moved")
            for (element_id,) in store.run("batch_move_queued", {"now": now}).fetchall():
                counts[part_of.get(element_id, 0)][2] += 1
        added = store.run("batch_insert_new", {"now": now}).rowcount
        if added:
            if parts == 1:
                counts[0][3] = added
            else:
                for part, new in store.run("batch_new_parts").fetchall():
                    counts[part][3] = new
            if store.run("any_dead").fetchone()[0]:
                store.run("batch_revive_dead")
            store.run("batch_count_new_in_queues", {"now": now})
            store.run("batch_count_new_in_groups")
        pairs = set(store.run("batch_ready_pairs", {"now": now}).fetchall())
        if any(count[2] for count in counts):  # the sub-queues they left
            pairs.update(store.run("touched_take").fetchall())
            store.run("touched_clear")
        for pair in pairs:
            self._refresh_pair(pair, now)
        return counts

    # -- claim -----------------------------------------------------------------------------

    def claim(
        self, queues: Sequence[str], worker: str, limit: int, lease: Leases
    ) -> tuple[ClaimResult, list[str]]:
        store = self.store
        claimed: list[Claimed] = []
        with store.transaction():
            now = self.clock()
            opened = self._expire_leases(now)
            known = [(name, q.id) for name in queues if (q := self._queue(name)) is not None]
            for _, queue_id in known:
                params = {"queue_id": queue_id, "now": now}
                promoted = {g for (g,) in store.run("promote_delayed", params).fetchall()}
                for group_id in promoted:
                    self._refresh_pair((queue_id, group_id), now)
                store.run("promote_frontier", params)
            ends = {name: now + lease_of(lease, name) for name, _ in known}
            while len(claimed) < limit:
                best: tuple[int, float, int, int, str] | None = None
                for name, queue_id in known:
                    row = store.run("best_head", {"queue_id": queue_id}).fetchone()
                    if row is not None:
                        group_id, priority, due, head = row
                        rank = (-priority, due, head, group_id, name)
                        if best is None or rank < best:
                            best = rank
                if best is None:
                    break
                _, _, head, group_id, name = best
                claimed.append(self._take(name, head, group_id, worker, now, ends[name]))
            next_at = None if len(claimed) >= limit else self._next_at([q for _, q in known], now)
            wake = self._wake_addresses(opened)
        return ClaimResult(elements=claimed, next_at=next_at), wake

    def _take(
        self, queue: str, head: int, group_id: int, worker: str, now: float, lease_until: float
    ) -> Claimed:
        store = self.store
        key, payload, attempts, priority, due = store.run(
            "take_element",
            {"id": head, "lease_until": lease_until, "worker": worker, "now": now},
        ).fetchone()
        queue_id = self._queues[queue].id
        if group_id != NO_GROUP_ID:
            (gate,) = store.run("mark_start", {"now": now, "group_id": group_id}).fetchone()
            if gate > now:  # it was open (claimable): its sub-queues wait from now on
                self._refresh_gate(group_id, now)
        self._refresh_pair((queue_id, group_id), now)
        return Claimed(
            ref=head,
            queue=queue,
            key=key,
            payload=payload,
            group=self._group_name(group_id),
            priority=priority,
            due=due,
            attempt=attempts,
            claimed_at=now,
            lease_until=lease_until,
        )

    def _expire_leases(self, now: float) -> set[int]:
        """Returns to their queues the elements whose worker stopped renewing their lease."""
        expired = self.store.run("expired_leases", {"now": now}).fetchall()
        pairs: set[Pair] = set()
        gates: set[int] = set()
        for element_id, queue_id, group_id in expired:
            self._requeue(element_id, None, now, 0, "lease expired", (queue_id, group_id), pairs)
            gates.add(group_id)
        return self._settle(pairs, gates, now) if expired else set()

    def _next_at(self, queue_ids: Sequence[int], now: float) -> float | None:
        times = [self.store.value("next_lease_expiry")]
        for queue_id in queue_ids:
            params = {"queue_id": queue_id}
            times.append(self.store.value("next_gate", params))
            times.append(self.store.value("next_delayed", params))
        real = [t for t in times if t is not None and t < NEVER]
        return max(now, min(real)) if real else None

    # -- finishing -------------------------------------------------------------------------

    def _requeue(
        self,
        element_id: int,
        due: float | None,
        now: float,
        attempts_delta: int,
        error: str | None,
        pair: Pair,
        pairs: set[Pair],
    ) -> None:
        params = {
            "id": element_id,
            "due": due,
            "now": now,
            "attempts_delta": attempts_delta,
            "error": error,
        }
        (state,) = self.store.run("requeue", params).fetchone()
        if state == READY:
            pairs.add(pair)

    def _finish(self, element: Claimed, row: Lease, now: float, pairs: set[Pair]) -> None:
        """Done with an element: queued afresh if scheduled while running, else removed."""
        queue_id, group_id, state, next_due, _, seen, digest = row
        if seen:
            self.store.run("remember_seen", {"queue_id": queue_id, "h": digest})
        if state == RUNNING and next_due is not None:
            self.store.run("requeue_pending", {"id": element.ref, "now": now})
            if next_due <= now:
                pairs.add((queue_id, group_id))
        else:
            self.store.run("delete_element", {"id": element.ref})
            if state == READY:
                pairs.add((queue_id, group_id))

    def _each_leased(
        self,
        elements: Sequence[Claimed],
        action: Callable[[int, Lease, float, set[Pair]], None],
        *,
        running_only: bool,
    ) -> set[int]:
        """Applies `action(i, lease, now, pairs)` to each element whose lease is still this run's
        (its attempt and claim time fence it), inside the caller's transaction; returns the
        queues that got claimable work."""
        pairs: set[Pair] = set()
        gates: set[int] = set()
        now = self.clock()
        for i, element in enumerate(elements):
            params = {
                "id": element.ref,
                "attempt": element.attempt,
                "claimed_at": element.claimed_at,
            }
            lease: Lease | None = self.store.run("lookup_lease", params).fetchone()
            if lease is None or (running_only and lease[2] != RUNNING):
                continue
            if lease[2] == RUNNING:
                gates.add(lease[1])
            action(i, lease, now, pairs)
        return self._settle(pairs, gates, now)

    def _acked(self, elements: Sequence[Claimed]) -> set[int]:
        def done(i: int, lease: Lease, now: float, pairs: set[Pair]) -> None:
            self._finish(elements[i], lease, now, pairs)

        # An element whose lease expired, but that no one ran again yet, is done too.
        return self._each_leased(elements, done, running_only=False)

    def _failed(self, failures: Sequence[Failure]) -> set[int]:
        def failed(i: int, lease: Lease, now: float, pairs: set[Pair]) -> None:
            failure = failures[i]
            element = failure.element
            # A schedule that came while it ran (next_due) wins over a last failure too: it
            # would take a dead letter out again.
            if failure.retry_at is not None or lease[3] is not None:
                pair = (lease[0], lease[1])
                self._requeue(element.ref, failure.retry_at, now, 0, failure.error, pair, pairs)
                return
            params = {
                "id": element.ref,
                "error": failure.error,
                "traceback": failure.traceback,
                "now": now,
            }
            self.store.run("bury", params)
            self._finish(element, lease, now, pairs)

        return self._each_leased([f.element for f in failures], failed, running_only=True)

    def ack(self, elements: Sequence[Claimed]) -> list[str]:
        with self.store.transaction():
            return self._wake_addresses(self._acked(elements))

    def fail(self, failures: Sequence[Failure]) -> list[str]:
        with self.store.transaction():
            return self._wake_addresses(self._failed(failures))

    def finish(
        self, follow: Sequence[Schedule], acks: Sequence[Claimed], failures: Sequence[Failure]
    ) -> list[str]:
        """What a worker finished, in one transaction: the follow-up work first, then the acks
        and failures; returns whom to wake."""
        try:
            with self.store.transaction():
                queues = self._scheduled_queues(follow, self._schedule(follow)) if follow else set()
                queues |= self._acked(acks) | self._failed(failures)
                return self._wake_addresses(queues)
        except TurnTaken:
            raise  # before the transaction began: nothing to undo
        except BaseException:
            self._forget_groups()  # ids it cached may be of groups it inserted, now undone
            raise

    def release(self, elements: Sequence[Claimed]) -> list[str]:
        def returned(i: int, lease: Lease, now: float, pairs: set[Pair]) -> None:
            element = elements[i]
            self._requeue(element.ref, element.due, now, -1, None, (lease[0], lease[1]), pairs)

        with self.store.transaction():
            return self._wake_addresses(self._each_leased(elements, returned, running_only=True))

    def heartbeat(self, worker: WorkerInfo, elements: Sequence[Claimed], lease: Leases) -> None:
        with self.store.transaction():
            now = self.clock()
            self.store.many(
                "extend_lease",
                [
                    {
                        "id": e.ref,
                        "attempt": e.attempt,
                        "claimed_at": e.claimed_at,
                        "lease_until": now + lease_of(lease, e.queue),
                    }
                    for e in elements
                ],
            )
            self.store.run("worker_upsert", self._worker_row(worker, now))  # again, if pruned
            self.store.run("workers_prune", {"before": now - WORKER_TTL})

    # -- workers ---------------------------------------------------------------------------

    def _wake_addresses(self, queue_ids: Iterable[int]) -> list[str]:
        """The workers to wake because the given queues got claimable work."""
        ids = sorted(set(queue_ids))
        if not ids:
            return []
        params = {"queue_ids": json.dumps(ids)}
        return [address for (address,) in self.store.run("wake_addresses", params)]

    def register_worker(self, worker: WorkerInfo) -> None:
        with self.store.transaction():
            now = self.clock()
            self.store.run("workers_prune", {"before": now - WORKER_TTL})
            self.store.run("worker_upsert", self._worker_row(worker, now))

    @staticmethod
    def _worker_row(worker: WorkerInfo, now: float) -> dict[str, object]:
        return {
            "id": worker.id,
            "host": worker.host,
            "pid": worker.pid,
            "queues": ",".join(worker.queues),
            "now": now,
            "wake_address": worker.wake_address,
            "concurrency": worker.concurrency,
        }

    def unregister_worker(self, worker_id: str) -> None:
        with self.store.transaction():
            self.store.run("worker_delete", {"id": worker_id})

    def workers(self) -> list[WorkerInfo]:
        return [
            WorkerInfo(
                id=wid,
                host=host,
                pid=pid,
                queues=tuple(q for q in queues.split(",") if q),
                started=started,
                heartbeat=beat,
                wake_address=address,
                running=running,
                concurrency=concurrency,
            )
            for wid, host, pid, queues, started, beat, address, running, concurrency in (
                self.store.run("workers_all")
            )
        ]

    # -- limits and blocks ----------------------------------------------------------------

    def limits(self) -> list[LimitRule]:
        return _rules_of(self.store.run("limits_all"))

    def set_limits(
        self, rules: Sequence[LimitRule], delete: str | None = None
    ) -> tuple[bool, list[str]]:
        """Stores `rules` (limits.merged) and deletes the rule and Crawl-delay named `delete`;
        (whether there was one to delete, the addresses to wake)."""
        with self.store.transaction():
            now = self.clock()
            deleted = False
            if delete is not None:
                deleted = self.store.run("limit_delete", {"pattern": delete}).rowcount > 0
                gone = self.store.run("crawl_delay_delete", {"name": delete}).rowcount > 0
                deleted = deleted or gone
            for new in rules:
                stored = _rules_of(self.store.run("limit_get", {"pattern": new.pattern}))
                rule = merged(next(iter(stored), None), new)
                if rule is not None:
                    self.store.run(
                        "limit_set",
                        {
                            "pattern": rule.pattern,
                            "concurrency": rule.limit.concurrency,
                            "interval": rule.limit.interval,
                            "origin": rule.origin,
                        },
                    )
            patterns = [rule.pattern for rule in rules] + ([delete] if delete else [])
            return deleted, self._follow_limits(patterns, now)

    def crawl_delays(self, groups: Collection[str] | None = None) -> dict[str, float]:
        if groups is None:
            return dict(self.store.run("crawl_delays_all"))
        found = {}
        for name in groups:
            row = self.store.run("crawl_delay_get", {"name": name}).fetchone()
            if row is not None:
                found[name] = row[0]
        return found

    def robots_answer(self, origin: str) -> tuple[bytes, float] | None:
        now = self.clock()
        row = self.store.run("robots_answer_get", {"origin": origin, "now": now}).fetchone()
        return None if row is None else (bytes(row[0]), row[1] - now)

    def keep_robots_answer(self, origin: str, answer: bytes, seconds: float) -> None:
        with self.store.transaction():
            now = self.clock()
            self.store.run("robots_answers_expire", {"now": now})
            params = {"origin": origin, "answer": answer, "until": now + seconds}
            self.store.run("robots_answer_keep", params)

    def raise_crawl_delays(self, delays: Mapping[str, float]) -> list[str]:
        """Backend.raise_crawl_delays; the addresses to wake."""
        with self.store.transaction():
            now = self.clock()
            for name, seconds in delays.items():
                self.store.run("crawl_delay_raise", {"name": name, "seconds": seconds})
            return self._follow_limits(list(delays), now)

    def _follow_limits(self, patterns: list[str], now: float) -> list[str]:
        """Brings the limits of the groups `patterns` may match in line with the rules and
        Crawl-delays stored now; the addresses to wake."""
        current = _Rules(self.store)
        changed: set[int] = set()
        for group_id, name, concurrency, interval in self._groups_matching(patterns):
            limit = current.resolve(name)
            if (limit.concurrency, limit.interval) != (concurrency, interval):
                params = {
                    "group_id": group_id,
                    "concurrency": limit.concurrency,
                    "interval": limit.interval,
                }
                self.store.run("group_set_limit", params)
                changed.add(group_id)
        return self._wake_addresses(self._settle(set(), changed, now))

    def _groups_matching(self, patterns: list[str]) -> list[tuple[int, str, int | None, float]]:
        """The groups (id, name, concurrency, interval) whose limit rules `patterns` may change:
        an exact pattern's group, found by name; for a glob, every group is matched."""
        globs = [pattern for pattern in patterns if not is_exact(pattern)]
        if globs:
            return [
                row
                for row in self.store.run("groups_all").fetchall()
                if any(fnmatchcase(row[1], glob) for glob in globs) or row[1] in patterns
            ]
        return [
            row
            for name in dict.fromkeys(patterns)
            if (row := self.store.run("group_limit_by_name", {"name": name}).fetchone())
        ]

    def block_group(self, group: str, until: float | None, reason: str | None) -> list[str]:
        with self.store.transaction():
            now = self.clock()
            group_id = self._group_id(group, _Rules(self.store))
            self.store.run(
                "group_block",
                {"group_id": group_id, "until": until, "reason": reason if until else None},
            )
            return self._wake_addresses(self._settle(set(), {group_id}, now))

    def reserve_send(
        self,
        group: str,
        gap: float,
        earliest: float,
        replacing: float | None = None,
        max_wait: float | None = None,
    ) -> tuple[float, float, bool]:
        """(the reserved time, seconds from now to it, whether `replacing` was kept):
        Backend.reserve_send_slot."""
        with self.store.transaction():
            now = self.clock()
            reserved = None
            if replacing is not None:
                params = {"name": group, "mine": replacing, "earliest": now + earliest}
                reserved = self.store.value("send_replace", params)
            kept = reserved is not None
            if reserved is None and max_wait is not None:
                previous = self.store.value("send_at", {"name": group})
                at = now + earliest if previous is None else max(now + earliest, previous + gap)
                if at - now > max_wait:
                    return at, at - now, False
            if reserved is None:
                params = {"name": group, "earliest": now + earliest, "gap": gap}
                reserved = self.store.value("send_reserve", params)
            return float(reserved), max(0.0, float(reserved) - now), kept

    # -- introspection ----------------------------------------------------------------------

    def queue_stats(self, names: Sequence[str] | None) -> list[QueueStats]:
        now = self.clock()
        stats = []
        for queue_id, name, *_ in self.store.run("queues_all").fetchall():
            if names is not None and name not in names:
                continue
            counts = dict.fromkeys((DELAYED, READY, RUNNING, DEAD), 0)
            counts.update(self.store.run("queue_counts", {"queue_id": queue_id}).fetchall())
            overdue = self.store.value("queue_overdue", {"queue_id": queue_id, "now": now})
            stats.append(
                QueueStats(
                    name=name,
                    total=counts[DELAYED] + counts[READY] + counts[RUNNING],
                    due=counts[READY] + overdue,
                    delayed=counts[DELAYED] - overdue,
                    running=counts[RUNNING],
                    dead=counts[DEAD],
                )
            )
        return stats

    def group_stats(self, pattern: str, limit: int, include_idle: bool) -> list[GroupStats]:
        params = {"pattern": sqlite_glob(pattern), "limit": limit, "all": int(include_idle)}
        stats = []
        for name, queued, running, concurrency, interval, last, blocked, reason in self.store.run(
            "group_stats", params
        ):
            limit_ = Limit(concurrency=concurrency, interval=interval) if name else UNLIMITED
            next_start = last + interval if last is not None and interval else None
            stats.append(
                GroupStats(
                    name=name,
                    queued=queued,
                    running=running,
                    limit=limit_,
                    next_start=next_start,
                    blocked_until=blocked,
                    block_reason=reason,
                )
            )
        return stats

    def element(self, queue: str, key: str) -> ElementInfo | None:
        found = self._queue(queue)
        if found is None:
            raise UnknownQueue(queue)
        params = {"queue_id": found.id, "h": key_hash(key), "key": key}
        row = self.store.run("element_by_key", params).fetchone()
        if row is not None:
            return self._element_info(queue, row)
        dead = self.store.run("dead_by_key", params).fetchone()
        if dead is None:
            return None
        *row, past = dead
        return dead_element(_dead_letter(queue, row), attempts_of(past))

    def _element_info(self, queue: str, row: tuple[Any, ...]) -> ElementInfo:
        key, payload, group, state, due, priority, attempts, lease, worker, error, nxt, past = row
        return live_element(
            queue=queue,
            key=key,
            payload=payload,
            group=group,
            state=state,
            due=due,
            priority=priority,
            attempts=attempts,
            lease_until=lease,
            worker=worker,
            error=error,
            next_due=nxt,
            history=attempts_of(past),
            now=self.clock(),
        )

    def worker_elements(self, worker_id: str, limit: int) -> list[ElementInfo]:
        rows = self.store.run("worker_elements", {"worker": worker_id, "limit": limit})
        return [self._element_info(queue, tuple(rest)) for queue, *rest in rows]

    def check(self) -> list[str]:
        """Every broken internal invariant, as a sentence; empty when consistent."""
        now = self.clock()
        store = self.store
        with store.transaction():
            problems = [
                f"queue {name}: count of state {state} is {counted}, elements say {actual}"
                for name, state, counted, actual in store.run("check_counts")
            ]
            problems += [
                f"group {name}: counts queued {q} running {r}, elements say {aq} and {ar}"
                for name, q, r, aq, ar in store.run("check_group_counts")
            ]
            problems += [
                f"element {key} of queue {queue_id}: state {state} and its lease disagree"
                for queue_id, key, state in store.run("check_leases")
            ]
            problems += [
                f"element {key} of queue {queue_id}: its schedule remembered for after a run"
                " is incomplete, or it is not running"
                for queue_id, key in store.run("check_remembered")
            ]
            problems += [
                f"frontier of queue {q}, group {g}: head {head}, best ready element {best}"
                for q, g, head, best in store.run("check_frontier_heads")
            ]
            problems += [
                f"frontier of queue {q}, group {g}: active={active} wake_at={at}, gate {gate}"
                for q, g, active, at, gate in store.run("check_frontier_gates", {"now": now})
            ]
        return problems

    # -- dead letters -----------------------------------------------------------------------

    def dead_letters(self, queue: str, limit: int, offset: int) -> list[DeadLetter]:
        found = self._queue(queue)
        if found is None:
            raise UnknownQueue(queue)
        rows = self.store.run(
            "dead_list", {"queue_id": found.id, "limit": limit, "offset": offset}
        ).fetchall()
        return [_dead_letter(queue, row) for row in rows]

    def take_dead(
        self, queue: str, keys: Sequence[str] | None, requeue: bool
    ) -> tuple[int, list[str]]:
        found = self._queue(queue)
        if found is None:
            raise UnknownQueue(queue)
        with self.store.transaction():
            now = self.clock()
            if keys is None:
                taken = self.store.run(
                    "dead_take_all", {"queue_id": found.id, "limit": -1}
                ).fetchall()
                # Oldest first, those that died at the same time by key, as on Redis: the
                # order they are queued again in.
                taken.sort(key=lambda row: (row[4], row[0]))
                rows = [row[:4] for row in taken]
            else:
                rows = []
                for key in keys:
                    rows.extend(
                        self.store.run("dead_take", {"queue_id": found.id, "key": key}).fetchall()
                    )
            if not requeue or not rows:
                return len(rows), []
            self._apply_batch(
                [
                    BatchRow(
                        found.id,
                        key,
                        payload,
                        gid,
                        now,
                        priority,
                        Mode.OVERWRITE.value,
                        key_hash(key),
                        False,
                    )
                    for key, payload, gid, priority in rows
                ],
                now,
            )
            return len(rows), self._wake_addresses([found.id])


def _rules_of(rows: Iterable[tuple[str, int | None, float, Origin]]) -> list[LimitRule]:
    return [
        LimitRule(pattern=p, limit=Limit(concurrency=c, interval=i), origin=o)
        for p, c, i, o in rows
    ]


class _Rules:
    """The limit rules one transaction resolves groups with: the glob rules, read once, and
    each group's own rule and Crawl-delay, read by name (a crawl may hold a Crawl-delay for
    each of 100,000 hosts)."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self._globs: list[LimitRule] | None = None

    def resolve(self, group: str) -> Limit:
        if self._globs is None:
            self._globs = _rules_of(self.store.run("limits_globs"))
        own = None
        if is_exact(group):
            own = next(iter(_rules_of(self.store.run("limit_get", {"pattern": group}))), None)
        limit = resolve_indexed(group, own, self._globs)
        floor = self.store.value("crawl_delay_get", {"name": group})
        return limit if floor is None else at_least(limit, floor)
