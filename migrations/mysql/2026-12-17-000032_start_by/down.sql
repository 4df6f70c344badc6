ALTER TABLE jobvisor_jobs DROP KEY jobvisor_jobs_start_by_idx, DROP COLUMN start_by;
