-- Partition keys: an optional key per job (a tenant, an account id such as 'acct:42'), kept
-- on the archive too. The index serves counting the running jobs of one queue and partition
-- (a per-partition concurrency limit checked by the claim). SQLite has partial indexes, and
-- its planner uses this one when the query says `state = 'running'` with the literal and
-- compares `partition_key` (which implies `IS NOT NULL`), as the claim does: as on
-- PostgreSQL, it holds only the running jobs that have a partition, so neither an enqueue nor
-- the claim of a job without a partition touches it (a full `(queue, state, partition_key)`
-- index would add an entry to every insert and every state change).
ALTER TABLE jobvisor_jobs ADD COLUMN partition_key TEXT NULL;
ALTER TABLE jobvisor_jobs_archive ADD COLUMN partition_key TEXT NULL;
CREATE INDEX jobvisor_jobs_partition_running_idx ON jobvisor_jobs (queue, partition_key)
    WHERE state = 'running' AND partition_key IS NOT NULL;
