-- Job dependencies (NewJob::after, batches). A child waits in the new state `waiting`,
-- which no claim takes (the claim's guard and indexes name `pending` and `retrying` only).
--   has_children   set, under the parent's row lock, when a child is enqueued; the finalize
--                  statement returns it, so a job without children costs no statement more
--   jobvisor_job_deps  one row per (child, parent): the child's policy for a failed parent
--                  (`cancel`, `run`, `wait`) and whether the parent's end was counted (`done`)
ALTER TABLE jobvisor_jobs DROP CONSTRAINT jobvisor_jobs_state_check;
ALTER TABLE jobvisor_jobs ADD CONSTRAINT jobvisor_jobs_state_check
    CHECK (state IN ('pending', 'waiting', 'running', 'retrying', 'succeeded', 'dead', 'cancelled'));
ALTER TABLE jobvisor_jobs ADD COLUMN has_children BOOLEAN NOT NULL DEFAULT false;

CREATE TABLE jobvisor_job_deps (
    child_id  BIGINT     NOT NULL,
    parent_id BIGINT     NOT NULL,
    policy    VARCHAR(8) NOT NULL CHECK (policy IN ('cancel', 'run', 'wait')),
    done      BOOLEAN    NOT NULL DEFAULT false,
    PRIMARY KEY (child_id, parent_id)
);
-- a finished parent's children; a child's open edges
CREATE INDEX jobvisor_job_deps_parent_idx ON jobvisor_job_deps (parent_id, done);
CREATE INDEX jobvisor_job_deps_open_idx ON jobvisor_job_deps (child_id, done);

-- Wake listening nodes when a waiting child is released (the insert trigger's notice, for
-- the update that makes it due).
CREATE FUNCTION jobvisor_notify_release() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('jobvisor_jobs', NEW.queue);
    RETURN NULL;
END;
$$;

CREATE TRIGGER jobvisor_jobs_notify_release
    AFTER UPDATE OF state ON jobvisor_jobs
    FOR EACH ROW WHEN (OLD.state = 'waiting' AND NEW.state = 'pending')
    EXECUTE FUNCTION jobvisor_notify_release();
