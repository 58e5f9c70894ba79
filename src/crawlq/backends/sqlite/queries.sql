-- Named queries of the SQLite backend, loaded by name (`-- name: x`). Parameters are named.
-- Tables: see migrations/. Temp tables `batch` and `touched` live per connection.

-- name: create_temp_tables
CREATE TEMP TABLE IF NOT EXISTS batch (
    queue_id INTEGER NOT NULL, key TEXT NOT NULL, payload TEXT, group_id INTEGER NOT NULL,
    due REAL NOT NULL, priority INTEGER NOT NULL, mode INTEGER NOT NULL, h INTEGER NOT NULL,
    check_seen INTEGER NOT NULL, part INTEGER NOT NULL,  -- which of the batches applied at once
    old_id INTEGER, old_state INTEGER, old_due REAL, old_group INTEGER  -- the queued twin
);  -- no key index: the engine hands over each (queue, key) once
CREATE TEMP TABLE IF NOT EXISTS touched (queue_id INTEGER NOT NULL, group_id INTEGER NOT NULL);

-- name: batch_clear
DELETE FROM temp.batch;

-- name: batch_add
INSERT INTO temp.batch (queue_id, key, payload, group_id, due, priority, mode, h, check_seen, part)
VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?);

-- name: batch_classify
UPDATE temp.batch SET old_id = e.id, old_state = e.state, old_due = e.due, old_group = e.group_id
  FROM elements e
 WHERE e.queue_id = batch.queue_id AND e.h = batch.h AND e.key = batch.key;

-- name: batch_drop_seen
-- Keys finished before (and not queued now) are skipped unless a revisit was asked.
DELETE FROM temp.batch
 WHERE check_seen AND old_id IS NULL
   AND EXISTS (SELECT 1 FROM seen s WHERE s.queue_id = batch.queue_id AND s.h = batch.h)
RETURNING part;

-- name: batch_queued_parts
SELECT old_id, part FROM temp.batch WHERE old_id IS NOT NULL;

-- name: batch_new_parts
SELECT part, count(*) FROM temp.batch WHERE old_id IS NULL GROUP BY part;

-- name: batch_defer_running
-- A running element is never started twice: remember the new schedule for when it finishes.
-- Its payload too (next_payload holds the key itself for a payload that is the key; NULL when
-- it is the running one's).
UPDATE elements
   SET next_due = b.due, next_priority = b.priority,
       next_payload = CASE WHEN b.payload IS elements.payload THEN NULL
                           ELSE coalesce(b.payload, b.key) END
  FROM temp.batch b
 WHERE elements.id = b.old_id AND b.old_state = 2
   AND (b.mode = 0 OR (b.mode = 1 AND (elements.next_due IS NULL OR b.due < elements.next_due)))
RETURNING id;

-- name: batch_touch_moved
INSERT INTO temp.touched (queue_id, group_id)
SELECT queue_id, old_group FROM temp.batch
 WHERE old_state < 2 AND (mode = 0 OR (mode = 1 AND due < old_due));

-- name: batch_move_queued
-- A new schedule starts its attempts afresh (as one made while it ran does): a run whose lease
-- expired before it then acks too late to finish it.
UPDATE elements
   SET due = b.due, priority = b.priority, payload = b.payload, group_id = b.group_id,
       state = CASE WHEN b.due > :now THEN 0 ELSE 1 END, attempts = 0
  FROM temp.batch b
 WHERE elements.id = b.old_id AND b.old_state < 2
   AND (b.mode = 0 OR (b.mode = 1 AND b.due < b.old_due))
RETURNING id;

-- name: batch_insert_new
INSERT INTO elements (queue_id, h, key, payload, group_id, priority, due, state)
SELECT queue_id, h, key, payload, group_id, priority, due, CASE WHEN due > :now THEN 0 ELSE 1 END
  FROM temp.batch WHERE old_id IS NULL;

-- name: batch_revive_dead
-- A dead element scheduled anew is alive again: its dead letter goes, as `requeue_dead` takes it.
DELETE FROM dead WHERE id IN (
    SELECT d.id FROM temp.batch b JOIN dead d ON d.queue_id = b.queue_id AND d.key = b.key
     WHERE b.old_id IS NULL);

-- name: any_dead
SELECT EXISTS (SELECT 1 FROM dead);

-- name: batch_count_new_in_queues
UPDATE counts SET n = counts.n + c.n
  FROM (SELECT queue_id, CASE WHEN due > :now THEN 0 ELSE 1 END AS state, count(*) AS n
          FROM temp.batch WHERE old_id IS NULL GROUP BY 1, 2) AS c
 WHERE counts.queue_id = c.queue_id AND counts.state = c.state;

-- name: batch_count_new_in_groups
UPDATE groups SET queued = groups.queued + c.n
  FROM (SELECT group_id, count(*) AS n FROM temp.batch WHERE old_id IS NULL GROUP BY 1) AS c
 WHERE groups.id = c.group_id;

-- name: batch_ready_pairs
SELECT DISTINCT queue_id, group_id FROM temp.batch WHERE due <= :now;

-- name: touched_take
SELECT DISTINCT queue_id, group_id FROM temp.touched;

-- name: touched_clear
DELETE FROM temp.touched;

-- name: refresh_pair
-- Sets the head of one (queue, group) sub-queue and its group's gate; the caller drops the row
-- when this inserts nothing (no ready element left).
INSERT INTO frontier (queue_id, group_id, priority, due, head, wake_at, active)
SELECT e.queue_id, e.group_id, e.priority, e.due, e.id, g.gate, g.gate <= :now
  FROM elements e JOIN group_gate g ON g.id = e.group_id
 WHERE e.queue_id = :queue_id AND e.group_id = :group_id AND e.state = 1
 ORDER BY e.priority DESC, e.due, e.id
 LIMIT 1
    ON CONFLICT (queue_id, group_id) DO UPDATE
   SET priority = excluded.priority, due = excluded.due, head = excluded.head,
       wake_at = excluded.wake_at, active = excluded.active;

-- name: drop_pair
DELETE FROM frontier WHERE queue_id = :queue_id AND group_id = :group_id;

-- name: refresh_gate
-- The group's limits or state changed: every sub-queue of it waits for its new gate.
UPDATE frontier SET wake_at = g.gate, active = g.gate <= :now
  FROM (SELECT gate FROM group_gate WHERE id = :group_id) AS g
 WHERE frontier.group_id = :group_id
RETURNING queue_id;

-- name: expired_leases
-- A lease runs out at its end, as an element is due at its due time: the claim that the
-- next claimable time (`next_lease_expiry`) wakes must find it expired.
SELECT id, queue_id, group_id FROM elements
 WHERE state = 2 AND lease_until <= :now
 LIMIT 200;

-- name: promote_delayed
UPDATE elements SET state = 1
 WHERE id IN (SELECT id FROM elements WHERE queue_id = :queue_id AND state = 0 AND due <= :now
               ORDER BY due LIMIT 5000)
RETURNING group_id;

-- name: promote_frontier
UPDATE frontier SET active = 1 WHERE queue_id = :queue_id AND active = 0 AND wake_at <= :now;

-- name: best_head
SELECT group_id, priority, due, head FROM frontier
 WHERE queue_id = :queue_id AND active = 1
 ORDER BY priority DESC, due, head
 LIMIT 1;

-- name: take_element
-- The attempt joins the history, which keeps the last 10.
UPDATE elements
   SET state = 2, attempts = attempts + 1, lease_until = :lease_until, worker = :worker,
       claimed_at = :now, history = json_insert(
           CASE WHEN json_array_length(coalesce(history, '[]')) >= 10
                THEN json_remove(history, '$[0]') ELSE coalesce(history, '[]') END,
           '$[#]', json_array(attempts + 1, :now, :worker, NULL))
 WHERE id = :id
RETURNING key, coalesce(payload, key), attempts, priority, due;

-- name: mark_start
-- Returns the group's gate after this start (as group_gate reads it).
UPDATE groups SET last_start = :now WHERE id = :group_id
RETURNING CASE WHEN concurrency IS NOT NULL AND running >= concurrency THEN 1e300
               ELSE max(coalesce(last_start + interval, 0), coalesce(blocked_until, 0)) END;

-- name: next_gate
SELECT min(wake_at) FROM frontier WHERE queue_id = :queue_id AND active = 0;

-- name: next_delayed
SELECT min(due) FROM elements WHERE queue_id = :queue_id AND state = 0;

-- name: next_lease_expiry
SELECT min(lease_until) FROM elements WHERE state = 2;

-- name: lookup_lease
-- The attempt and the claim's time fence the lease: an ack from a run whose lease expired and
-- that ran again is stale. (NULL: claimed before schema 4.)
SELECT e.queue_id, e.group_id, e.state, e.next_due, e.next_priority, q.seen, e.h
  FROM elements e JOIN queues q ON q.id = e.queue_id
 WHERE e.id = :id AND e.attempts = :attempt
   AND (e.claimed_at = :claimed_at OR e.claimed_at IS NULL);

-- name: requeue
-- Back to the queue at `due` (or at the schedule that arrived while it ran); a NULL `due`
-- keeps the element's own due time.
UPDATE elements
   SET due = coalesce(next_due, :due, due), priority = coalesce(next_priority, priority),
       payload = CASE WHEN next_payload IS NULL THEN payload
                      WHEN next_payload = key THEN NULL ELSE next_payload END,
       state = CASE WHEN coalesce(next_due, :due, due) > :now THEN 0 ELSE 1 END,
       attempts = CASE WHEN next_due IS NULL THEN attempts + :attempts_delta ELSE 0 END,
       next_due = NULL, next_priority = NULL, next_payload = NULL, lease_until = NULL,
       worker = NULL, error = coalesce(:error, error),
       history = json_set(history, '$[#-1][3]', coalesce(:error, 'released'))
 WHERE id = :id
RETURNING state;

-- name: requeue_pending
-- Finished, but scheduled again while running: queued afresh at that schedule.
UPDATE elements
   SET due = next_due, priority = next_priority,
       payload = CASE WHEN next_payload IS NULL THEN payload
                      WHEN next_payload = key THEN NULL ELSE next_payload END,
       state = CASE WHEN next_due > :now THEN 0 ELSE 1 END,
       attempts = 0, next_due = NULL, next_priority = NULL, next_payload = NULL,
       lease_until = NULL, worker = NULL,
       error = NULL, history = json_set(history, '$[#-1][3]', 'done, scheduled again')
 WHERE id = :id;

-- name: delete_element
DELETE FROM elements WHERE id = :id;

-- name: remember_seen
INSERT OR IGNORE INTO seen (queue_id, h) VALUES (:queue_id, :h);

-- name: bury
INSERT INTO dead (queue_id, key, payload, group_id, attempts, error, traceback, died_at, history,
                  priority)
SELECT queue_id, key, payload, group_id, attempts, :error, :traceback, :now,
       json_set(history, '$[#-1][3]', :error), priority
  FROM elements WHERE id = :id
    ON CONFLICT (queue_id, key) DO UPDATE
   SET payload = excluded.payload, group_id = excluded.group_id, attempts = excluded.attempts,
       error = excluded.error, traceback = excluded.traceback, died_at = excluded.died_at,
       history = excluded.history, priority = excluded.priority;

-- name: extend_lease
UPDATE elements SET lease_until = :lease_until
 WHERE id = :id AND attempts = :attempt AND state = 2
   AND (claimed_at = :claimed_at OR claimed_at IS NULL);

-- name: group_by_name
SELECT id FROM groups WHERE name = :name;

-- name: group_name
SELECT name FROM groups WHERE id = :group_id;

-- name: group_insert
INSERT INTO groups (name, concurrency, interval) VALUES (:name, :concurrency, :interval)
RETURNING id;

-- name: group_set_limit
UPDATE groups SET concurrency = :concurrency, interval = :interval WHERE id = :group_id;

-- name: group_block
UPDATE groups SET blocked_until = :until, block_reason = :reason WHERE id = :group_id;

-- name: send_reserve
INSERT INTO send_times (name, at) VALUES (:name, :earliest)
    ON CONFLICT (name) DO UPDATE SET at = max(:earliest, at + :gap)
    RETURNING at;

-- name: send_at
SELECT at FROM send_times WHERE name = :name;

-- name: send_replace
UPDATE send_times SET at = max(at, :earliest) WHERE name = :name AND at = :mine RETURNING at;

-- name: group_limit_by_name
SELECT id, name, concurrency, interval FROM groups WHERE name = :name;

-- name: groups_all
SELECT id, name, concurrency, interval FROM groups WHERE id != 0;

-- name: limits_all
SELECT pattern, concurrency, interval, origin FROM limits ORDER BY pattern;

-- name: limits_globs
SELECT pattern, concurrency, interval, origin FROM limits WHERE pattern GLOB '*[*?[]*';

-- name: limit_get
SELECT pattern, concurrency, interval, origin FROM limits WHERE pattern = :pattern;

-- name: limit_set
INSERT INTO limits (pattern, concurrency, interval, origin)
    VALUES (:pattern, :concurrency, :interval, :origin)
    ON CONFLICT (pattern) DO UPDATE
    SET concurrency = excluded.concurrency, interval = excluded.interval, origin = excluded.origin;

-- name: limit_delete
DELETE FROM limits WHERE pattern = :pattern;

-- name: crawl_delays_all
SELECT name, seconds FROM crawl_delays ORDER BY name;

-- name: crawl_delay_get
SELECT seconds FROM crawl_delays WHERE name = :name;

-- name: crawl_delay_raise
INSERT INTO crawl_delays (name, seconds) VALUES (:name, :seconds)
    ON CONFLICT (name) DO UPDATE SET seconds = excluded.seconds
    WHERE excluded.seconds > crawl_delays.seconds;

-- name: crawl_delay_delete
DELETE FROM crawl_delays WHERE name = :name;

-- name: queue_by_name
SELECT id, group_by, custom_key, seen FROM queues WHERE name = :name;

-- name: queue_upsert
INSERT INTO queues (name, group_by, custom_key, seen) VALUES (:name, :group_by, :custom_key, :seen)
    ON CONFLICT (name) DO UPDATE
   SET group_by = excluded.group_by, custom_key = excluded.custom_key, seen = excluded.seen
RETURNING id;

-- name: queue_counts_init
INSERT OR IGNORE INTO counts (queue_id, state) VALUES (:queue_id, 0), (:queue_id, 1), (:queue_id, 2), (:queue_id, 3);

-- name: queues_all
SELECT id, name, group_by, custom_key, seen FROM queues ORDER BY name;

-- name: queue_counts
SELECT state, n FROM counts WHERE queue_id = :queue_id;

-- name: queue_overdue
SELECT count(*) FROM elements WHERE queue_id = :queue_id AND state = 0 AND due <= :now;

-- name: group_stats
SELECT g.name, g.queued, g.running, g.concurrency, g.interval, g.last_start,
       g.blocked_until, g.block_reason
  FROM groups g
 WHERE g.id != 0 AND g.name GLOB :pattern AND (g.queued > 0 OR g.running > 0 OR :all)
 ORDER BY g.running DESC, g.queued DESC, g.name
 LIMIT :limit;

-- name: dead_list
-- Newest first; those that died at the same time by key, as on Redis.
SELECT d.key, coalesce(d.payload, d.key), g.name, d.attempts, d.error, d.traceback, d.died_at
  FROM dead d JOIN groups g ON g.id = d.group_id
 WHERE d.queue_id = :queue_id
 ORDER BY d.died_at DESC, d.key DESC
 LIMIT :limit OFFSET :offset;

-- name: dead_take
DELETE FROM dead WHERE queue_id = :queue_id AND key = :key
RETURNING key, payload, group_id, priority;

-- name: dead_take_all
DELETE FROM dead WHERE id IN (SELECT id FROM dead WHERE queue_id = :queue_id LIMIT :limit)
RETURNING key, payload, group_id, priority, died_at;

-- name: worker_upsert
INSERT INTO workers (id, host, pid, queues, started, heartbeat, wake_address, concurrency)
VALUES (:id, :host, :pid, :queues, :now, :now, :wake_address, :concurrency)
    ON CONFLICT (id) DO UPDATE SET heartbeat = excluded.heartbeat;

-- name: worker_delete
DELETE FROM workers WHERE id = :id;

-- name: workers_prune
DELETE FROM workers WHERE heartbeat < :before;

-- name: workers_all
SELECT w.id, w.host, w.pid, w.queues, w.started, w.heartbeat, w.wake_address,
       (SELECT count(*) FROM elements e WHERE e.worker = w.id AND e.state = 2), w.concurrency
  FROM workers w ORDER BY w.started;

-- name: wake_addresses
-- The workers of any queue in :queue_ids (a JSON array), so a write to one stage's queue
-- leaves the other stages' workers asleep.
SELECT w.wake_address FROM workers w
 WHERE w.wake_address != ''
   AND EXISTS (SELECT 1 FROM queues q JOIN json_each(:queue_ids) j ON q.id = j.value
                WHERE instr(',' || w.queues || ',', ',' || q.name || ',') > 0);

-- Consistency checks (`Engine.check`): each returns the rows that break one invariant.

-- name: check_counts
SELECT q.name, s.state, coalesce(c.n, 0), coalesce(a.n, 0)
  FROM queues q
 CROSS JOIN (SELECT 0 AS state UNION ALL SELECT 1 UNION ALL SELECT 2 UNION ALL SELECT 3) s
  LEFT JOIN counts c ON c.queue_id = q.id AND c.state = s.state
  LEFT JOIN (SELECT queue_id, state, count(*) AS n FROM elements GROUP BY 1, 2
             UNION ALL SELECT queue_id, 3, count(*) FROM dead GROUP BY 1) a
    ON a.queue_id = q.id AND a.state = s.state
 WHERE coalesce(c.n, 0) != coalesce(a.n, 0);

-- name: check_group_counts
SELECT g.name, g.queued, g.running, coalesce(a.queued, 0), coalesce(a.running, 0)
  FROM groups g
  LEFT JOIN (SELECT group_id, sum(state < 2) AS queued, sum(state = 2) AS running
               FROM elements GROUP BY 1) a ON a.group_id = g.id
 WHERE g.id != 0 AND (g.queued != coalesce(a.queued, 0) OR g.running != coalesce(a.running, 0));

-- name: check_leases
SELECT queue_id, key, state FROM elements
 WHERE (state = 2) != (lease_until IS NOT NULL) OR state NOT IN (0, 1, 2);

-- name: check_remembered
-- A schedule remembered for after a run (next_*) belongs to a running element, time and
-- priority together.
SELECT queue_id, key FROM elements
 WHERE (next_due IS NULL) != (next_priority IS NULL)
    OR (next_due IS NULL AND next_payload IS NOT NULL)
    OR (next_due IS NOT NULL AND state != 2);

-- name: check_frontier_heads
-- Every (queue, group) with ready elements has a row showing its best one, and no other row.
SELECT e.queue_id, e.group_id, f.head, e.id
  FROM (SELECT queue_id, group_id, id,
               row_number() OVER (PARTITION BY queue_id, group_id
                                  ORDER BY priority DESC, due, id) AS n
          FROM elements WHERE state = 1) e
  LEFT JOIN frontier f ON f.queue_id = e.queue_id AND f.group_id = e.group_id
 WHERE e.n = 1 AND (f.head IS NULL OR f.head != e.id)
UNION ALL
SELECT f.queue_id, f.group_id, f.head, NULL FROM frontier f
 WHERE NOT EXISTS (SELECT 1 FROM elements e WHERE e.id = f.head AND e.state = 1
                      AND e.queue_id = f.queue_id AND e.group_id = f.group_id
                      AND e.priority = f.priority AND e.due = f.due);

-- name: check_frontier_gates
-- Active rows belong to open groups; waiting rows wait for their group's gate, or for a
-- time past, as the group's is (a claim that leaves its group open moves its gate, not its
-- other queues' rows: the next claim of those queues finds them due).
SELECT f.queue_id, f.group_id, f.active, f.wake_at, g.gate
  FROM frontier f JOIN group_gate g ON g.id = f.group_id
 WHERE (f.active AND g.gate > :now)
    OR (NOT f.active AND f.wake_at != g.gate AND (f.wake_at > :now OR g.gate > :now));

-- name: element_by_key
SELECT e.key, coalesce(e.payload, e.key), g.name, e.state, e.due, e.priority, e.attempts,
       e.lease_until, e.worker, e.error, e.next_due, e.history
  FROM elements e JOIN groups g ON g.id = e.group_id
 WHERE e.queue_id = :queue_id AND e.h = :h AND e.key = :key;

-- name: dead_by_key
SELECT d.key, coalesce(d.payload, d.key), g.name, d.attempts, d.error, d.traceback, d.died_at,
       d.history
  FROM dead d JOIN groups g ON g.id = d.group_id
 WHERE d.queue_id = :queue_id AND d.key = :key;

-- name: worker_elements
SELECT q.name, e.key, coalesce(e.payload, e.key), g.name, e.state, e.due, e.priority, e.attempts,
       e.lease_until, e.worker, e.error, e.next_due, e.history
  FROM elements e JOIN queues q ON q.id = e.queue_id JOIN groups g ON g.id = e.group_id
 WHERE e.worker = :worker AND e.state = 2
 ORDER BY q.name, e.key
 LIMIT :limit;

-- name: robots_answer_get
SELECT answer, until FROM robots_answers WHERE origin = :origin AND until > :now;

-- name: robots_answer_keep
INSERT OR REPLACE INTO robots_answers (origin, answer, until) VALUES (:origin, :answer, :until);

-- name: robots_answers_expire
DELETE FROM robots_answers WHERE origin IN (
    SELECT origin FROM robots_answers WHERE until <= :now ORDER BY until LIMIT 100
);
