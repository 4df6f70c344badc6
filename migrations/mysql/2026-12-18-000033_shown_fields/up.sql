-- What reads show and the rows did not keep.
-- A job's sequence key and start-by deadline (the job page, `Client::get`): the live job
-- keeps its sequence key (NULL outside a sequence), written by the enqueue that appends it;
-- the archive keeps both the key and the deadline, copied with the row. Read only, never
-- filtered on: no index.
ALTER TABLE jobvisor_jobs ADD COLUMN sequence_key VARCHAR(255) NULL;
ALTER TABLE jobvisor_jobs_archive ADD COLUMN start_by BIGINT NULL,
    ADD COLUMN sequence_key VARCHAR(255) NULL;
-- A run-time schedule keeps when a node last declared a schedule of its name in code: the
-- code's one is not stored while this one holds the name, and the schedules page and
-- `jobvisor schedules` say so. NULL until that happens.
ALTER TABLE jobvisor_schedules ADD COLUMN shadowed_at BIGINT NULL;
