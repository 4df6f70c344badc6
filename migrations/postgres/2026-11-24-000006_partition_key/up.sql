-- Partition keys: an optional key per job (a tenant, an account id such as 'acct:42'), kept
-- on the archive too. The index serves counting the running jobs of one queue and partition
-- (a per-partition concurrency limit checked by the claim): partial on `state = 'running'`,
-- so it holds only the few running jobs (a node's concurrency and prefetch), stays small
-- whatever the backlog, and enqueues of pending jobs never touch it.
ALTER TABLE jobvisor_jobs ADD COLUMN partition_key TEXT NULL;
ALTER TABLE jobvisor_jobs_archive ADD COLUMN partition_key TEXT NULL;
CREATE INDEX jobvisor_jobs_partition_running_idx ON jobvisor_jobs (queue, partition_key)
    WHERE state = 'running';
