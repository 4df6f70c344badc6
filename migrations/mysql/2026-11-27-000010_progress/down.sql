ALTER TABLE jobvisor_jobs_archive DROP COLUMN progress;
ALTER TABLE jobvisor_jobs DROP COLUMN progress;
