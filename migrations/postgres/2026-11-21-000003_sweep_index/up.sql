-- The sweep index keyed on "has a lease" instead of "state = 'running'" (every transition
-- out of running clears the lease, so it holds the same rows). Finalize and renew say
-- `state = 'running'` in their guards; with the old predicate the planner could read the
-- whole index and join in memory when its statistics were taken with no job running, instead
-- of looking each job up by primary key.
DROP INDEX jobvisor_jobs_sweep_idx;
CREATE INDEX jobvisor_jobs_sweep_idx ON jobvisor_jobs (lease_expires_at)
    WHERE lease_expires_at IS NOT NULL;
