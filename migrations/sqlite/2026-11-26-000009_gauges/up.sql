-- The database-wide gauges (jobs by queue and state, due jobs by queue and priority with the
-- oldest due time, node heartbeats), computed by one node per interval and read by all: a
-- node takes the turn with one guarded UPDATE of `computed_at` (only if the last turn is at
-- least an interval old), runs the grouped counts, and stores them here as JSON; every node
-- exports what it reads, so a scrape of any node costs the database nothing and the counts
-- run once per database per interval, however many nodes there are. One row, id 1.
CREATE TABLE jobvisor_gauges (
    id          INTEGER PRIMARY KEY,
    computed_at BIGINT  NOT NULL,
    computed_by TEXT    NULL,
    took_us     BIGINT  NOT NULL,
    snapshot    TEXT    NOT NULL
);
INSERT INTO jobvisor_gauges (id, computed_at, computed_by, took_us, snapshot) VALUES (1, 0, NULL, 0, '{}');
