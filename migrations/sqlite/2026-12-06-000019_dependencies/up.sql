-- Job dependencies (NewJob::after, batches). A child waits in the new state `waiting`,
-- which no claim takes (the claim's guard and indexes name `pending` and `retrying` only).
-- SQLite cannot change a CHECK constraint in place: the live table is rebuilt (the
-- documented 12-step procedure), keeping every row, index and the id sequence.
--   has_children   set when a child is enqueued (under the writer lock); the finalize
--                  statement returns it, so a job without children costs no statement more
--   jobvisor_job_deps  one row per (child, parent): the child's policy for a failed parent
--                  (`cancel`, `run`, `wait`) and whether the parent's end was counted (`done`)
CREATE TABLE jobvisor_jobs_new (
    id                  INTEGER PRIMARY KEY AUTOINCREMENT,
    queue               TEXT    NOT NULL DEFAULT 'default',
    kind                TEXT    NOT NULL,
    unique_key          TEXT    NULL,
    state               TEXT    NOT NULL CHECK (state IN ('pending', 'waiting', 'running', 'retrying', 'succeeded', 'dead', 'cancelled')),
    priority            INTEGER NOT NULL DEFAULT 10,
    payload             TEXT    NOT NULL CHECK (json_valid(payload)),
    result              TEXT    NULL,
    last_error          TEXT    NULL,
    errors              TEXT    NOT NULL DEFAULT '[]',
    attempts            INTEGER NOT NULL DEFAULT 0,
    max_attempts        INTEGER NOT NULL,
    run_at              BIGINT  NOT NULL,
    timeout_ms          BIGINT  NOT NULL,
    timeout_at          BIGINT  NULL,
    lease_owner         TEXT    NULL,
    lease_token         TEXT    NULL,
    lease_expires_at    BIGINT  NULL,
    heartbeat_at        BIGINT  NULL,
    version             BIGINT  NOT NULL DEFAULT 1,
    cancel_requested_at BIGINT  NULL,
    created_at          BIGINT  NOT NULL,
    updated_at          BIGINT  NOT NULL,
    first_started_at    BIGINT  NULL,
    finished_at         BIGINT  NULL,
    started_at          BIGINT  NULL,
    refunds             INTEGER NOT NULL DEFAULT 0,
    partition_key       TEXT    NULL,
    unique_hold         TEXT    NULL,
    unique_until        BIGINT  NULL,
    unique_scope        TEXT    NULL
        CHECK (unique_scope IN ('until_archived', 'while_active', 'for')),
    progress            TEXT    NULL,
    has_children        BOOLEAN NOT NULL DEFAULT 0
);
INSERT INTO jobvisor_jobs_new (
    id, queue, kind, unique_key, state, priority, payload, result, last_error, errors,
    attempts, max_attempts, run_at, timeout_ms, timeout_at, lease_owner, lease_token,
    lease_expires_at, heartbeat_at, version, cancel_requested_at, created_at, updated_at,
    first_started_at, finished_at, started_at, refunds, partition_key, unique_hold,
    unique_until, unique_scope, progress)
SELECT
    id, queue, kind, unique_key, state, priority, payload, result, last_error, errors,
    attempts, max_attempts, run_at, timeout_ms, timeout_at, lease_owner, lease_token,
    lease_expires_at, heartbeat_at, version, cancel_requested_at, created_at, updated_at,
    first_started_at, finished_at, started_at, refunds, partition_key, unique_hold,
    unique_until, unique_scope, progress
FROM jobvisor_jobs;
-- The id sequence continues where the old table's stopped (archived ids are never reused).
DELETE FROM sqlite_sequence WHERE name = 'jobvisor_jobs_new';
INSERT INTO sqlite_sequence (name, seq)
    SELECT 'jobvisor_jobs_new', seq FROM sqlite_sequence WHERE name = 'jobvisor_jobs';
DROP TABLE jobvisor_jobs;
ALTER TABLE jobvisor_jobs_new RENAME TO jobvisor_jobs;
CREATE INDEX jobvisor_jobs_claim_idx ON jobvisor_jobs (queue, priority, run_at, id)
    WHERE state IN ('pending', 'retrying');
CREATE INDEX jobvisor_jobs_archive_idx ON jobvisor_jobs (finished_at)
    WHERE state IN ('succeeded', 'dead', 'cancelled');
CREATE INDEX jobvisor_jobs_sweep_idx ON jobvisor_jobs (lease_expires_at)
    WHERE lease_expires_at IS NOT NULL;
CREATE INDEX jobvisor_jobs_partition_running_idx ON jobvisor_jobs (queue, partition_key)
    WHERE state = 'running' AND partition_key IS NOT NULL;
CREATE UNIQUE INDEX jobvisor_jobs_unique_hold_idx ON jobvisor_jobs (kind, unique_hold);
CREATE INDEX jobvisor_jobs_partition_claim_idx
    ON jobvisor_jobs (queue, partition_key, priority, run_at, id, kind)
    WHERE state IN ('pending', 'retrying') AND partition_key IS NOT NULL;

CREATE TABLE jobvisor_job_deps (
    child_id  BIGINT  NOT NULL,
    parent_id BIGINT  NOT NULL,
    policy    TEXT    NOT NULL CHECK (policy IN ('cancel', 'run', 'wait')),
    done      BOOLEAN NOT NULL DEFAULT 0,
    PRIMARY KEY (child_id, parent_id)
) WITHOUT ROWID;
CREATE INDEX jobvisor_job_deps_parent_idx ON jobvisor_job_deps (parent_id, done);
CREATE INDEX jobvisor_job_deps_open_idx ON jobvisor_job_deps (child_id, done);
