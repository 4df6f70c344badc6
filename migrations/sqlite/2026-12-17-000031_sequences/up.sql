-- Ordered sequences (NewJob::sequence): one row per sequence key with the last job enqueued
-- in it. An enqueue in a sequence updates the key's row (under the writer lock, so commit
-- order is enqueue order), moving the old tail to prev_job_id and reading it back; the new
-- job then waits for that tail as for a parent. A row whose last job was archived is
-- deleted by the archiver.
CREATE TABLE jobvisor_sequences (
    sequence_key TEXT   NOT NULL PRIMARY KEY,
    last_job_id  BIGINT NOT NULL,
    prev_job_id  BIGINT NULL
) WITHOUT ROWID;
CREATE INDEX jobvisor_sequences_last_idx ON jobvisor_sequences (last_job_id);
