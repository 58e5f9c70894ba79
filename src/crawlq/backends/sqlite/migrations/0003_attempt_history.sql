-- crawlq schema 3: each element keeps its last attempts (JSON array of [attempt, claimed at,
-- worker, outcome]; outcome NULL while running), and dead letters keep them too.
ALTER TABLE elements ADD COLUMN history TEXT;
ALTER TABLE dead ADD COLUMN history TEXT;
