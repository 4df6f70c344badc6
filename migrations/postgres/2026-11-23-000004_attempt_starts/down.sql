ALTER TABLE jobvisor_jobs_archive DROP COLUMN refunds;
ALTER TABLE jobvisor_jobs_archive DROP COLUMN started_at;
ALTER TABLE jobvisor_jobs DROP COLUMN refunds;
ALTER TABLE jobvisor_jobs DROP COLUMN started_at;
