-- One partial index of running jobs serves both the sweeper and the limited claims' counts.
-- 000014 added (queue, partition_key) WHERE state = 'running' beside the sweep index
-- (lease_expires_at) WHERE lease_expires_at IS NOT NULL: both hold exactly the running jobs,
-- so every claim (a non-HOT update into 'running') wrote an entry into each of them. With the
-- expiry as the last key column the running index answers the sweeper too (a full scan of
-- the running jobs, sorted: few rows), and the claim writes one entry instead of two.
CREATE INDEX jobvisor_jobs_running_sweep_idx ON jobvisor_jobs (queue, partition_key, lease_expires_at)
    WHERE state = 'running';
DROP INDEX jobvisor_jobs_running_idx;
DROP INDEX jobvisor_jobs_sweep_idx;
