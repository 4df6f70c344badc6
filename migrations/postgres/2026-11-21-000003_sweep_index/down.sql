DROP INDEX jobvisor_jobs_sweep_idx;
CREATE INDEX jobvisor_jobs_sweep_idx ON jobvisor_jobs (lease_expires_at) WHERE state = 'running';
