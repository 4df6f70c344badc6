-- Partition keys: an optional key per job (a tenant, an account id such as 'acct:42'), at
-- most 255 bytes, kept on the archive too. MySQL has no partial indexes, so counting the
-- running jobs of one queue and partition (a per-partition concurrency limit checked by the
-- claim) uses `(queue, state, partition_key)`: the equality on `state = 'running'` inside the
-- key confines the count to the running jobs' entries, which are few, however many jobs wait.
-- Every insert and state change writes an entry in it, as with the sweep and archive
-- indexes, which also carry `state`.
ALTER TABLE jobvisor_jobs ADD COLUMN partition_key VARCHAR(255) NULL;
ALTER TABLE jobvisor_jobs_archive ADD COLUMN partition_key VARCHAR(255) NULL;
CREATE INDEX jobvisor_jobs_partition_running_idx ON jobvisor_jobs (queue, state, partition_key);
