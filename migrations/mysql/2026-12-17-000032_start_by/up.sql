-- Start-by deadlines (NewJob::start_by): the instant (µs since the epoch, as run_at) after
-- which the job never starts; NULL without one. Written by the enqueue of a job that has one
-- (a statement after its insert), never changed; read by the claim (as the time left, which
-- the start gate checks) and by the sweeper, which ends pending, retrying and waiting jobs
-- past it as cancelled with the code `expired`.
-- The sweeper's walk (MariaDB has no partial index: a job without a deadline has a NULL
-- entry).
ALTER TABLE jobvisor_jobs ADD COLUMN start_by BIGINT NULL,
    ADD KEY jobvisor_jobs_start_by_idx (start_by);
