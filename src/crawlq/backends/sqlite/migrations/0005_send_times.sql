-- crawlq schema 5: the time reserved for each group's latest request (Backend.reserve_send),
-- so requests to a host keep its interval whichever worker, on whichever machine, sends them.
CREATE TABLE send_times (
    name TEXT PRIMARY KEY,
    at REAL NOT NULL
) WITHOUT ROWID;
