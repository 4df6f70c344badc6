CREATE INDEX jobvisor_jobs_sweep_idx ON jobvisor_jobs (lease_expires_at)
    WHERE lease_expires_at IS NOT NULL;
CREATE INDEX jobvisor_jobs_running_idx ON jobvisor_jobs (queue, partition_key)
    WHERE state = 'running';
DROP INDEX jobvisor_jobs_running_sweep_idx;
