-- Partition keys: an optional key per job (a tenant, an account id such as 'acct:42'), kept
-- on the archive too. The index serves counting the running jobs of one queue and partition
-- (a per-partition concurrency limit checked by the claim). SQLite has partial indexes, and
-- its planner uses one when the query says `state = 'running'` with the literal, as the
-- claim does: so, as on PostgreSQL, it holds only the running jobs and an enqueue of a
-- pending job never touches it (a full `(queue, state, partition_key)` index would add an
-- entry to every insert).
ALTER TABLE jobvisor_jobs ADD COLUMN partition_key TEXT NULL;
ALTER TABLE jobvisor_jobs_archive ADD COLUMN partition_key TEXT NULL;
CREATE INDEX jobvisor_jobs_partition_running_idx ON jobvisor_jobs (queue, partition_key)
    WHERE state = 'running';
