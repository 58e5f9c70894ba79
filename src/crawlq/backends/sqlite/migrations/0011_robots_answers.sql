-- crawlq schema 11: what a worker made of an origin's robots.txt, kept for every worker on
-- every process until `until` (the backend's clock), so that robots.txt is fetched once per
-- origin, not once per process. Rows past their time are deleted as answers are kept.
CREATE TABLE robots_answers (
    origin TEXT PRIMARY KEY,
    answer BLOB NOT NULL,
    until  REAL NOT NULL
) WITHOUT ROWID;
CREATE INDEX robots_answers_until ON robots_answers (until);
