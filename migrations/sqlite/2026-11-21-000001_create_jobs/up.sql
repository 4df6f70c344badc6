-- jobvisor schema v1 (SQLite). Times are microseconds since the Unix epoch, UTC.
CREATE TABLE jobvisor_jobs (
    id                  INTEGER PRIMARY KEY AUTOINCREMENT,
    queue               TEXT    NOT NULL DEFAULT 'default',
    kind                TEXT    NOT NULL,
    unique_key          TEXT    NULL,
    state               TEXT    NOT NULL CHECK (state IN ('pending', 'running', 'retrying', 'succeeded', 'dead', 'cancelled')),
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
    finished_at         BIGINT  NULL
);
-- claim: due jobs of a queue in (priority, run_at, id) order
CREATE INDEX jobvisor_jobs_claim_idx ON jobvisor_jobs (queue, priority, run_at, id)
    WHERE state IN ('pending', 'retrying');
-- sweep: running jobs (few: a node's concurrency and prefetch) by lease expiry; the sweep
-- reads them all for the timeout backstop too, so one small index serves both.
CREATE INDEX jobvisor_jobs_sweep_idx ON jobvisor_jobs (lease_expires_at) WHERE state = 'running';
-- archive: terminal jobs by finish time
CREATE INDEX jobvisor_jobs_archive_idx ON jobvisor_jobs (finished_at)
    WHERE state IN ('succeeded', 'dead', 'cancelled');
-- dedup: (kind, unique_key) is unique among live rows; NULL keys never collide. (Not partial
-- here: an upsert's conflict target must match it, and diesel cannot express a partial one
-- for SQLite.)
CREATE UNIQUE INDEX jobvisor_jobs_unique_key_idx ON jobvisor_jobs (kind, unique_key);

CREATE TABLE jobvisor_jobs_archive (
    id                  BIGINT  PRIMARY KEY,
    queue               TEXT    NOT NULL,
    kind                TEXT    NOT NULL,
    unique_key          TEXT    NULL,
    state               TEXT    NOT NULL,
    priority            INTEGER NOT NULL,
    payload             TEXT    NOT NULL CHECK (json_valid(payload)),
    result              TEXT    NULL,
    last_error          TEXT    NULL,
    errors              TEXT    NOT NULL,
    attempts            INTEGER NOT NULL,
    max_attempts        INTEGER NOT NULL,
    run_at              BIGINT  NOT NULL,
    timeout_ms          BIGINT  NOT NULL,
    timeout_at          BIGINT  NULL,
    lease_owner         TEXT    NULL,
    lease_token         TEXT    NULL,
    lease_expires_at    BIGINT  NULL,
    heartbeat_at        BIGINT  NULL,
    version             BIGINT  NOT NULL,
    cancel_requested_at BIGINT  NULL,
    created_at          BIGINT  NOT NULL,
    updated_at          BIGINT  NOT NULL,
    first_started_at    BIGINT  NULL,
    finished_at         BIGINT  NULL,
    archived_at         BIGINT  NOT NULL
);
CREATE INDEX jobvisor_jobs_archive_prune_idx ON jobvisor_jobs_archive (archived_at);
CREATE INDEX jobvisor_jobs_archive_kind_key_idx ON jobvisor_jobs_archive (kind, unique_key);
