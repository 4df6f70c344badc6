-- Start-by deadlines (NewJob::start_by): the instant (µs since the epoch, as run_at) after
-- which the job never starts; NULL without one. Written by the enqueue of a job that has one
-- (a statement after its insert), never changed; read by the claim (as the time left, which
-- the start gate checks) and by the sweeper, which ends pending, retrying and waiting jobs
-- past it as cancelled with the code `expired`.
ALTER TABLE jobvisor_jobs ADD COLUMN start_by BIGINT NULL;
-- The sweeper's walk: jobs without a deadline are not in it.
CREATE INDEX jobvisor_jobs_start_by_idx ON jobvisor_jobs (start_by) WHERE start_by IS NOT NULL;
