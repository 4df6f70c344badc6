-- The audit log: one row per operator action (the dashboard's, the CLI's bulk actions), newest
-- last. Kept with the archive's retention: the archiver's prune deletes rows older than it.
--   at       epoch µs (UTC), the database's clock
--   who      who acted: the login's label, the application's identity, the CLI and its user
--   action   what was done, e.g. job.retry, bulk.cancel, queue.pause
--   target   what it was done to: a job id, a queue, a schedule, a bulk action's filter
--   jobs     how many jobs it changed (0 for a settings change or a refusal)
--   outcome  what happened, in words ("cancelled", "skipped 2 as moved on", why it was refused)
--   ok       whether it was carried out
CREATE TABLE jobvisor_audit (
    id      BIGINT       NOT NULL AUTO_INCREMENT PRIMARY KEY,
    at      BIGINT       NOT NULL,
    who     VARCHAR(255) NOT NULL,
    action  VARCHAR(64)  NOT NULL,
    target  TEXT         NOT NULL,
    jobs    BIGINT       NOT NULL,
    outcome TEXT         NOT NULL,
    ok      BOOLEAN      NOT NULL,
    INDEX jobvisor_audit_at (at)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;
