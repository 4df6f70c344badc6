-- The wake counter of the backends without notifications (see the MariaDB and SQLite
-- migrations of the same name). PostgreSQL never writes it: the same transitions notify
-- `jobvisor_jobs` with the queue instead, delivered at commit. The table exists here too so
-- that the schema, and the change signal's one statement, are the same on every backend.
CREATE TABLE jobvisor_wakes (
    id INTEGER NOT NULL PRIMARY KEY,
    n BIGINT NOT NULL
);
INSERT INTO jobvisor_wakes (id, n) VALUES (1, 0);
