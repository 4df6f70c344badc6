ALTER TABLE jobvisor_schedules DROP COLUMN shadowed_at;
ALTER TABLE jobvisor_jobs_archive DROP COLUMN sequence_key, DROP COLUMN start_by;
ALTER TABLE jobvisor_jobs DROP COLUMN sequence_key;
