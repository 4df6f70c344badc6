-- Jobs that released their key may share it with a newer one: only the holders keep it.
UPDATE jobvisor_jobs SET unique_key = NULL WHERE unique_key IS NOT NULL AND unique_hold IS NULL;
DROP INDEX jobvisor_jobs_unique_key_idx;
CREATE UNIQUE INDEX jobvisor_jobs_unique_key_idx ON jobvisor_jobs (kind, unique_key)
    WHERE unique_key IS NOT NULL;
DROP INDEX jobvisor_jobs_unique_hold_idx;
ALTER TABLE jobvisor_jobs_archive DROP COLUMN unique_scope;
ALTER TABLE jobvisor_jobs_archive DROP COLUMN unique_until;
ALTER TABLE jobvisor_jobs DROP COLUMN unique_scope;
ALTER TABLE jobvisor_jobs DROP COLUMN unique_until;
ALTER TABLE jobvisor_jobs DROP COLUMN unique_hold;
