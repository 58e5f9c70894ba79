-- crawlq schema 1. Element states: 0 delayed (due in the future), 1 ready (due, waiting for its
-- group), 2 running (leased). Dead elements live in `dead`. Counts are kept by triggers, except
-- for inserts: every insert goes through the batch statements (queries.sql), which count them
-- set-based, far cheaper than a trigger per row.

CREATE TABLE queues (
    id          INTEGER PRIMARY KEY,
    name        TEXT NOT NULL UNIQUE,
    group_by    TEXT NOT NULL,              -- host | domain | none | custom
    custom_key  INTEGER NOT NULL DEFAULT 0, -- 1: identity derived by the task's code
    seen        INTEGER NOT NULL DEFAULT 0  -- 1: remember finished keys in `seen`
);

-- Per queue and state (0, 1, 2, 3 = dead): element counts, so stats never scan.
CREATE TABLE counts (
    queue_id INTEGER NOT NULL,
    state    INTEGER NOT NULL,
    n        INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (queue_id, state)
) WITHOUT ROWID;

CREATE TABLE groups (
    id            INTEGER PRIMARY KEY,
    name          TEXT NOT NULL UNIQUE,
    concurrency   INTEGER,                   -- NULL: unlimited
    interval      REAL NOT NULL DEFAULT 0,
    queued        INTEGER NOT NULL DEFAULT 0,
    running       INTEGER NOT NULL DEFAULT 0,
    last_start    REAL,
    blocked_until REAL,
    block_reason  TEXT
);
-- The group of elements without one: never limited.
INSERT INTO groups (id, name) VALUES (0, '');

-- When a group next admits a start: never while full, else after its interval and any block.
CREATE VIEW group_gate AS
SELECT id,
       CASE WHEN concurrency IS NOT NULL AND running >= concurrency THEN 1e300
            ELSE max(coalesce(last_start + interval, 0), coalesce(blocked_until, 0)) END AS gate
FROM groups;

CREATE TABLE limits (
    pattern     TEXT PRIMARY KEY,
    concurrency INTEGER,
    interval    REAL NOT NULL
);
INSERT INTO limits VALUES ('*', 4, 0);

CREATE TABLE elements (
    id            INTEGER PRIMARY KEY,
    queue_id      INTEGER NOT NULL,
    h             INTEGER NOT NULL,          -- 64-bit digest of key: a dense identity index
    key           TEXT NOT NULL,
    payload       TEXT,                      -- NULL when the element is its own key
    group_id      INTEGER NOT NULL,
    priority      INTEGER NOT NULL,
    due           REAL NOT NULL,
    state         INTEGER NOT NULL,
    attempts      INTEGER NOT NULL DEFAULT 0,
    lease_until   REAL,
    worker        TEXT,
    next_due      REAL,                      -- scheduled again while running
    next_priority INTEGER,
    error         TEXT
);
-- Identity: (queue_id, h) finds the candidates, the key itself decides; so a digest collision
-- costs a comparison, never a lost element. The batch statements keep (queue_id, key) unique.
CREATE INDEX elements_identity ON elements (queue_id, h);
CREATE INDEX elements_delayed ON elements (queue_id, due) WHERE state = 0;
CREATE INDEX elements_ready ON elements (queue_id, group_id, priority DESC, due, id) WHERE state = 1;
CREATE INDEX elements_leases ON elements (lease_until) WHERE state = 2;
CREATE INDEX elements_worker ON elements (worker) WHERE state = 2;

-- The crawl frontier: one row per (queue, group) with ready elements, holding its head element.
-- Rows whose group admits a start are `active` and ordered by head priority; the others wait,
-- ordered by the time their group opens. A claim promotes the rows whose time has come and
-- takes the best active head, so its cost is independent of queued elements and blocked groups.
CREATE TABLE frontier (
    queue_id INTEGER NOT NULL,
    group_id INTEGER NOT NULL,
    priority INTEGER NOT NULL,
    due      REAL NOT NULL,
    head     INTEGER NOT NULL,
    wake_at  REAL NOT NULL,
    active   INTEGER NOT NULL,
    PRIMARY KEY (queue_id, group_id)
) WITHOUT ROWID;
CREATE INDEX frontier_waiting ON frontier (queue_id, wake_at) WHERE active = 0;
CREATE INDEX frontier_active ON frontier (queue_id, priority DESC, due, head) WHERE active = 1;
CREATE INDEX frontier_group ON frontier (group_id);

CREATE TABLE dead (
    id        INTEGER PRIMARY KEY,
    queue_id  INTEGER NOT NULL,
    key       TEXT NOT NULL,
    payload   TEXT,
    group_id  INTEGER NOT NULL,
    attempts  INTEGER NOT NULL,
    error     TEXT NOT NULL,
    traceback TEXT NOT NULL,
    died_at   REAL NOT NULL,
    UNIQUE (queue_id, key)
);

-- Finished keys of queues with `seen`, as 64-bit digests: bounded size per entry, on disk.
CREATE TABLE seen (
    queue_id INTEGER NOT NULL,
    h        INTEGER NOT NULL,
    PRIMARY KEY (queue_id, h)
) WITHOUT ROWID;

CREATE TABLE workers (
    id           TEXT PRIMARY KEY,
    host         TEXT NOT NULL,
    pid          INTEGER NOT NULL,
    queues       TEXT NOT NULL,
    started      REAL NOT NULL,
    heartbeat    REAL NOT NULL,
    wake_address TEXT NOT NULL
);

CREATE TRIGGER elements_deleted AFTER DELETE ON elements BEGIN
    UPDATE counts SET n = n - 1 WHERE queue_id = OLD.queue_id AND state = OLD.state;
    UPDATE groups SET queued = queued - (OLD.state < 2), running = running - (OLD.state = 2)
     WHERE id = OLD.group_id;
END;

CREATE TRIGGER elements_moved AFTER UPDATE OF state, group_id ON elements
WHEN OLD.state != NEW.state OR OLD.group_id != NEW.group_id BEGIN
    UPDATE counts SET n = n - 1 WHERE queue_id = OLD.queue_id AND state = OLD.state;
    UPDATE counts SET n = n + 1 WHERE queue_id = NEW.queue_id AND state = NEW.state;
    UPDATE groups SET queued = queued - (OLD.state < 2), running = running - (OLD.state = 2)
     WHERE id = OLD.group_id;
    UPDATE groups SET queued = queued + (NEW.state < 2), running = running + (NEW.state = 2)
     WHERE id = NEW.group_id;
END;

CREATE TRIGGER dead_inserted AFTER INSERT ON dead BEGIN
    UPDATE counts SET n = n + 1 WHERE queue_id = NEW.queue_id AND state = 3;
END;

CREATE TRIGGER dead_deleted AFTER DELETE ON dead BEGIN
    UPDATE counts SET n = n - 1 WHERE queue_id = OLD.queue_id AND state = 3;
END;
