-- Partition keys: an optional key per job (a tenant, an account id such as 'acct:42'), kept
-- on the archive too. The index serves counting the running jobs of one queue and partition
-- (a per-partition concurrency limit checked by the claim: `queue = $q AND partition_key = $p
-- AND state = 'running'`, which implies the predicate). Partial, so it holds only running jobs
-- that have a partition: a claim rewrites a job's index entries (its state changes), and
-- without `partition_key IS NOT NULL` every claim of every job would add an entry here
-- (measured in alternating runs: the raw-SQL and the jobvisor drain of 20,000 jobs without
-- partitions both about 15 % slower). Enqueues never touch it.
ALTER TABLE jobvisor_jobs ADD COLUMN partition_key TEXT NULL;
ALTER TABLE jobvisor_jobs_archive ADD COLUMN partition_key TEXT NULL;
CREATE INDEX jobvisor_jobs_partition_running_idx ON jobvisor_jobs (queue, partition_key)
    WHERE state = 'running' AND partition_key IS NOT NULL;
