-- Job progress: what a running handler last reported (`JobContext::progress`), as JSON.
-- Written only by the lease renewal, guarded by the attempt's token like every holder write,
-- so a report costs no statement of its own and a node that lost the lease cannot write it.
-- Kept when the attempt ends (a retry's handler reads it to resume) and on the archive.
ALTER TABLE jobvisor_jobs ADD COLUMN progress TEXT NULL;
ALTER TABLE jobvisor_jobs_archive ADD COLUMN progress TEXT NULL;
