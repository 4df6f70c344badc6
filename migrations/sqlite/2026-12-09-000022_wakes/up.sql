-- The wake counter: one row, moved by every transition that makes a job due now without a
-- new id (a dependency child released, a job retried by hand, a reclaimed job given back).
-- The change signal every node reads each 50 ms takes `n` with the newest job's id in its one
-- statement, so such a job is picked up by a node of another process within that interval
-- instead of at its poll. Enqueue, claim and finalize of an ordinary job never write it.
CREATE TABLE jobvisor_wakes (
    id INTEGER NOT NULL PRIMARY KEY,
    n BIGINT NOT NULL
);
INSERT INTO jobvisor_wakes (id, n) VALUES (1, 0);
