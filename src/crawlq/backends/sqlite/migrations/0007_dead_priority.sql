-- crawlq schema 7: a dead letter keeps its element's priority, so a requeued one takes its
-- place again instead of going behind everything of priority 0.
ALTER TABLE dead ADD COLUMN priority INTEGER NOT NULL DEFAULT 0;
