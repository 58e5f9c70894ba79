-- crawlq schema 8: each limit rule says who set it (app, operator or crawl), so that the
-- rules an app stores when a worker starts do not undo an operator's (limits.merged).
ALTER TABLE limits ADD COLUMN origin TEXT NOT NULL DEFAULT 'app';
