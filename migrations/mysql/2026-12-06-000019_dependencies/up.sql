-- Job dependencies (NewJob::after, batches). A child waits in the new state `waiting`,
-- which no claim takes (`claim_queue` is set for `pending` and `retrying` only).
--   has_children   set, under the parent's row lock, when a child is enqueued; the
--                  finalize's locking read returns it, so a job without children costs no
--                  statement more
--   jobvisor_job_deps  one row per (child, parent): the child's policy for a failed parent
--                  (`cancel`, `run`, `wait`) and whether the parent's end was counted (`done`)
ALTER TABLE jobvisor_jobs DROP CONSTRAINT jobvisor_jobs_state_check;
ALTER TABLE jobvisor_jobs ADD CONSTRAINT jobvisor_jobs_state_check
    CHECK (state IN ('pending', 'waiting', 'running', 'retrying', 'succeeded', 'dead', 'cancelled'));
ALTER TABLE jobvisor_jobs ADD COLUMN has_children BOOLEAN NOT NULL DEFAULT FALSE;

CREATE TABLE jobvisor_job_deps (
    child_id  BIGINT     NOT NULL,
    parent_id BIGINT     NOT NULL,
    policy    VARCHAR(8) NOT NULL,
    done      BOOLEAN    NOT NULL DEFAULT FALSE,
    PRIMARY KEY (child_id, parent_id),
    KEY jobvisor_job_deps_parent_idx (parent_id, done),
    KEY jobvisor_job_deps_open_idx (child_id, done),
    CONSTRAINT jobvisor_job_deps_policy_check CHECK (policy IN ('cancel', 'run', 'wait'))
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;
