DROP INDEX jobvisor_jobs_start_by_idx;
ALTER TABLE jobvisor_jobs DROP COLUMN start_by;
