-- 1. The insert trigger stays silent for an insert whose statement marked its transaction
-- (`jobvisor.notify` = 'after_commit', transaction-local): the store commits it itself and
-- announces its queues after the commit from a transaction of its own (after_commit.rs). A
-- transaction that notifies holds PostgreSQL's notification-queue lock from its commit until
-- the commit is flushed, so enqueues that each notified committed one at a time (200-290 a
-- second at 16 to 64 concurrent single enqueues). Any other insert (inside the caller's
-- transaction, a handler's, COPY, another process's SQL) notifies at its commit as before.
CREATE OR REPLACE FUNCTION jobvisor_notify_insert() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF current_setting('jobvisor.notify', true) = 'after_commit' THEN
        RETURN NULL;
    END IF;
    PERFORM pg_notify('jobvisor_jobs', q.queue)
    FROM (SELECT DISTINCT queue FROM new_rows
          WHERE run_at <= (EXTRACT(EPOCH FROM now()) * 1000000)::bigint) AS q;
    RETURN NULL;
END;
$$;

-- 2. Renewals and start records HOT: they change lease_expires_at, the last key of the
-- running index, so none of them could be a heap-only update, and the index, keyed by an
-- expiry that only grows, took a new entry at every renewal while holding the few running
-- jobs. Keyed by (queue, partition_key) alone, no column a renewal or a progress write
-- changes (lease_expires_at, heartbeat_at, started_at, first_started_at, timeout_at,
-- progress) is in any index of the table; the sweeper reads the running jobs through it and
-- checks their expiry in the rows (a few per node).
CREATE INDEX jobvisor_jobs_running_idx ON jobvisor_jobs (queue, partition_key)
    WHERE state = 'running';
DROP INDEX jobvisor_jobs_running_sweep_idx;
