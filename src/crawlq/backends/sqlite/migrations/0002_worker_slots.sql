-- crawlq schema 2: workers record their task slots, so tools can show slots in use.
ALTER TABLE workers ADD COLUMN concurrency INTEGER NOT NULL DEFAULT 0;
