-- crawlq schema 10: a schedule that comes while its element runs keeps its payload too, as
-- next_due and next_priority keep its time and priority: the element then runs with it, not
-- again with the payload of the run before (SPEC 3.2). NULL: none remembered, or the same as
-- the running one's. Unlike `payload`, it holds the payload itself when that is the key, so
-- NULL stays "keep the payload". Rows deferred before this read as NULL and keep theirs.
ALTER TABLE elements ADD COLUMN next_payload TEXT;
