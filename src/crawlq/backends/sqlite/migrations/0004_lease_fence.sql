-- crawlq schema 4: when the running lease was granted. With the attempt it fences the lease:
-- the attempts start afresh when an element is scheduled again while it runs, and a row id
-- may be given again to a new element, so the attempt alone can match a later run.
ALTER TABLE elements ADD COLUMN claimed_at REAL;
