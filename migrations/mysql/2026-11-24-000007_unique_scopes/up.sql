-- Unique-key scopes. `unique_key` stays the job's informational key; `unique_hold` carries
-- it while the job holds it, and the unique index moves from (kind, unique_key) to
-- (kind, unique_hold) (NULLs never collide): a job releases its key by setting `unique_hold`
-- to NULL in the same statement that ends it (scope 'while_active'), or another enqueue takes
-- an expired hold over (scope 'for', `unique_until` = enqueue time + period, epoch µs);
-- 'until_archived' holds it until the row leaves the table. No second index on the key:
-- MySQL has no partial indexes, and one more entry per insert would slow every enqueue.
-- Existing keyed rows keep today's rule: they hold their key until archived.
ALTER TABLE jobvisor_jobs
    ADD COLUMN unique_hold VARCHAR(255) NULL,
    ADD COLUMN unique_until BIGINT NULL,
    ADD COLUMN unique_scope VARCHAR(16) NULL;
ALTER TABLE jobvisor_jobs_archive
    ADD COLUMN unique_until BIGINT NULL,
    ADD COLUMN unique_scope VARCHAR(16) NULL;
UPDATE jobvisor_jobs SET unique_hold = unique_key, unique_scope = 'until_archived'
    WHERE unique_key IS NOT NULL;
UPDATE jobvisor_jobs_archive SET unique_scope = 'until_archived' WHERE unique_key IS NOT NULL;
ALTER TABLE jobvisor_jobs
    ADD UNIQUE INDEX jobvisor_jobs_unique_hold_idx (kind, unique_hold),
    DROP INDEX jobvisor_jobs_unique_key_idx;
