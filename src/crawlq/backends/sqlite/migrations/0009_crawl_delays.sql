-- crawlq schema 9: a host's robots.txt Crawl-delay is a floor under its group's interval, kept
-- apart from the limit rules. Stored as an exact rule it outranked every glob: an operator's
-- later '*.example.com' or the app's new '*' concurrency never reached a host with a Crawl-delay.
-- Each crawl rule was its group's name with the wildcard characters bracketed (glob_escape).
-- The groups' stored limits are resolved again once this has run (Engine, MIGRATED_DELAYS).
CREATE TABLE crawl_delays (
    name    TEXT PRIMARY KEY,
    seconds REAL NOT NULL
) WITHOUT ROWID;
INSERT OR REPLACE INTO crawl_delays (name, seconds)
    SELECT replace(replace(replace(pattern, '[*]', '*'), '[?]', '?'), '[[]', '['), interval
      FROM limits WHERE origin = 'crawl';
DELETE FROM limits WHERE origin = 'crawl';
