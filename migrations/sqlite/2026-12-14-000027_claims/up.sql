-- The execution ledger: one row per ended claim of a job, but for a claim that a finalize
-- batch ended in success while its job is live (the drain's hot path writes no row for it):
-- that claim is read from its job row's last_* columns below, and written to the ledger when
-- the job is archived. A claim still running is read from its job row (lease_owner,
-- lease_token). Rows are written by the statement, or the transaction, that ends the claim
-- (finalize, the handler's completion, the sweeper's reclaim), guarded by the claim's lease
-- token like the job row, so a late answer from an older claim writes nothing. Rows stay
-- while their job is live or archived and are deleted with it when it is pruned.
--   claim_id         the claim id (16 hex digits: the lease token's public part)
--   attempt          the job's attempt number of that claim
--   node             the node that held the claim
--   claimed_at, started_at, ended_at   epoch µs (UTC), the database's clock; started_at NULL:
--                    the handler's start was never recorded
--   outcome          succeeded, retried, failed, timed_out, fenced, cancelled, given_back,
--                    snoozed, lost
--   code             the error code of an outcome that has one
--   fence_margin_ms  how long before its fence point the holder ended the claim, where known
CREATE TABLE jobvisor_claims (
    job_id          BIGINT  NOT NULL,
    claim_id        TEXT    NOT NULL,
    attempt         INTEGER NOT NULL,
    node            TEXT    NOT NULL,
    claimed_at      BIGINT  NOT NULL,
    started_at      BIGINT  NULL,
    ended_at        BIGINT  NOT NULL,
    outcome         TEXT    NOT NULL,
    code            TEXT    NULL,
    fence_margin_ms BIGINT  NULL,
    PRIMARY KEY (job_id, claim_id)
) WITHOUT ROWID;

-- The claim a finalize last ended on the job (any outcome), as the claim left the row: its
-- node (lease_owner), its claim id (the lease token's first 16 hex digits; NULL for an
-- older build's token) and its instant (updated_at). Written by the finalize statement from
-- the row's own columns, no read of its own.
ALTER TABLE jobvisor_jobs ADD COLUMN last_node TEXT NULL;
ALTER TABLE jobvisor_jobs ADD COLUMN last_claim TEXT NULL;
ALTER TABLE jobvisor_jobs ADD COLUMN last_claimed_at BIGINT NULL;
