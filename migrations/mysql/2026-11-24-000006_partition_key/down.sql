DROP INDEX jobvisor_jobs_partition_running_idx ON jobvisor_jobs;
ALTER TABLE jobvisor_jobs_archive DROP COLUMN partition_key;
ALTER TABLE jobvisor_jobs DROP COLUMN partition_key;
