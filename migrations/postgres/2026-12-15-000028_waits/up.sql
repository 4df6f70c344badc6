-- Client::wait pushed (PostgreSQL only: the other backends have no notifications, and their
-- waits poll as before, so they have no use for the table). A wait registers its job here;
-- a transition that ends jobs calls jobvisor_announce_done with their ids, which notifies
-- `jobvisor_done` with those of them somebody waits on, and nothing when nobody waits: no
-- notification means no commit waits for the notify queue's lock (a `pg_notify` in every
-- finalize took pgbench from 4,827 to 1,679 tps at 8 clients).
--   job_id      the waited job
--   waiters     waits registered on it (a wait removes its own when it returns)
--   expires_at  epoch µs after which the row is stale: the longest registered wait's end
--               and a margin, so a waiter that crashed leaves nothing forever (a later
--               registration deletes stale rows)
CREATE TABLE jobvisor_waits (
    job_id     BIGINT  NOT NULL PRIMARY KEY,
    waiters    INTEGER NOT NULL,
    expires_at BIGINT  NOT NULL
);
-- VOLATILE, so in READ COMMITTED its query takes a snapshot of its own when it runs, after
-- the calling statement has locked and updated the ended rows: a wait registered before then
-- is seen, and one registered later read the job with FOR SHARE, which waited for the
-- ending transaction (see `store/waits.rs`). STRICT: not called for a batch that ended no
-- job. At most 300 ids a notification (a payload under PostgreSQL's 8,000 bytes).
CREATE FUNCTION jobvisor_announce_done(ids BIGINT[]) RETURNS INTEGER
    LANGUAGE plpgsql VOLATILE STRICT AS $$
DECLARE
    sent INTEGER;
BEGIN
    -- Nobody waits (the usual case): one read of the empty table, nothing else, whatever the
    -- batch's size (a probe of the key per id costs per job). Its cost (pgbench, 8 clients,
    -- 1-row transactions) is within noise of none; the notifying query run every time cost
    -- 15-30 %.
    PERFORM FROM jobvisor_waits LIMIT 1;
    IF NOT FOUND THEN
        RETURN 0;
    END IF;
    PERFORM pg_notify('jobvisor_done', string_agg(w.job_id::text, ','))
    FROM (SELECT job_id, (row_number() OVER () - 1) / 300 AS chunk
          FROM jobvisor_waits WHERE job_id = ANY(ids)) AS w
    GROUP BY w.chunk;
    GET DIAGNOSTICS sent = ROW_COUNT;
    RETURN sent;
END
$$;
