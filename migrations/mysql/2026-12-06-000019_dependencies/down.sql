DROP TABLE jobvisor_job_deps;
ALTER TABLE jobvisor_jobs DROP COLUMN has_children;
ALTER TABLE jobvisor_jobs DROP CONSTRAINT jobvisor_jobs_state_check;
ALTER TABLE jobvisor_jobs ADD CONSTRAINT jobvisor_jobs_state_check
    CHECK (state IN ('pending', 'running', 'retrying', 'succeeded', 'dead', 'cancelled'));
