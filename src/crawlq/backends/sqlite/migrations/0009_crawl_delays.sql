-- crawlq schema 9: a host's robots.txt Crawl-delay is a floor under its group's interval, kept
-- apart from the limit rules. Stored as an exact rule it outranked every glob: an operator's
-- later '*.example.com' or the app's new '*' concurrency never reached a host with a Crawl-delay.
CREATE TABLE crawl_delays (
    name    TEXT PRIMARY KEY,
    seconds REAL NOT NULL
) WITHOUT ROWID;
INSERT INTO crawl_delays (name, seconds)
    SELECT pattern, interval FROM limits WHERE origin = 'crawl' AND pattern NOT GLOB '*[*?[]*';
DELETE FROM limits WHERE origin = 'crawl' AND pattern NOT GLOB '*[*?[]*';
UPDATE limits SET origin = 'app' WHERE origin = 'crawl';
