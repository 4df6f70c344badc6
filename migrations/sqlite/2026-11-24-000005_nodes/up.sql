-- The nodes running a scheduler on this database and what each serves: its queues and the
-- job kinds it has handlers for (JSON arrays of names), with its start and last heartbeat
-- (epoch microseconds). Written by each node (registered at start, heartbeat every few
-- seconds, removed at shutdown); read to report jobs that wait in a queue no live node
-- serves, or of a kind no live node can run (a rolling deploy gone wrong).
CREATE TABLE jobvisor_nodes (
    node VARCHAR(200) PRIMARY KEY,
    queues TEXT NOT NULL,
    kinds TEXT NOT NULL,
    started_at BIGINT NOT NULL,
    heartbeat_at BIGINT NOT NULL
);
