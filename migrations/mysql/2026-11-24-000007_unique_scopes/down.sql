-- Jobs that released their key may share it with a newer one: only the holders keep it.
UPDATE jobvisor_jobs SET unique_key = NULL WHERE unique_key IS NOT NULL AND unique_hold IS NULL;
ALTER TABLE jobvisor_jobs
    ADD UNIQUE INDEX jobvisor_jobs_unique_key_idx (kind, unique_key),
    DROP INDEX jobvisor_jobs_unique_hold_idx;
ALTER TABLE jobvisor_jobs_archive DROP COLUMN unique_scope, DROP COLUMN unique_until;
ALTER TABLE jobvisor_jobs DROP COLUMN unique_scope, DROP COLUMN unique_until, DROP COLUMN unique_hold;
