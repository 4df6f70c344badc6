-- Unique-key scopes. `unique_key` stays the job's informational key; `unique_hold` carries
-- it while the job holds it, and the unique index moves from (kind, unique_key) to
-- (kind, unique_hold): a job releases its key by setting `unique_hold` to NULL in the same
-- statement that ends it (scope 'while_active'), or another enqueue takes an expired hold over
-- (scope 'for', `unique_until` = enqueue time + period, epoch µs); 'until_archived' holds it
-- until the row leaves the table. Partial, so jobs without a key never touch the index.
-- Existing keyed rows keep today's rule: they hold their key until archived.
ALTER TABLE jobvisor_jobs ADD COLUMN unique_hold TEXT NULL;
ALTER TABLE jobvisor_jobs ADD COLUMN unique_until BIGINT NULL;
ALTER TABLE jobvisor_jobs ADD COLUMN unique_scope TEXT NULL
    CHECK (unique_scope IN ('until_archived', 'while_active', 'for'));
ALTER TABLE jobvisor_jobs_archive ADD COLUMN unique_until BIGINT NULL;
ALTER TABLE jobvisor_jobs_archive ADD COLUMN unique_scope TEXT NULL;
UPDATE jobvisor_jobs SET unique_hold = unique_key, unique_scope = 'until_archived'
    WHERE unique_key IS NOT NULL;
UPDATE jobvisor_jobs_archive SET unique_scope = 'until_archived' WHERE unique_key IS NOT NULL;
CREATE UNIQUE INDEX jobvisor_jobs_unique_hold_idx ON jobvisor_jobs (kind, unique_hold)
    WHERE unique_hold IS NOT NULL;
-- The key itself stays searchable (lists by key), still only for keyed jobs.
DROP INDEX jobvisor_jobs_unique_key_idx;
CREATE INDEX jobvisor_jobs_unique_key_idx ON jobvisor_jobs (kind, unique_key)
    WHERE unique_key IS NOT NULL;
