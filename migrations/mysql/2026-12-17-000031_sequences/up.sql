-- Ordered sequences (NewJob::sequence): one row per sequence key with the last job enqueued
-- in it. An enqueue in a sequence updates the key's row (the row lock makes concurrent
-- enqueuers of one key take turns, so commit order is enqueue order), moving the old tail to
-- prev_job_id and reading it back; the new job then waits for that tail as for a parent.
-- A row whose last job was archived is deleted by the archiver.
CREATE TABLE jobvisor_sequences (
    sequence_key VARCHAR(255) NOT NULL PRIMARY KEY,
    last_job_id  BIGINT       NOT NULL,
    prev_job_id  BIGINT       NULL,
    KEY jobvisor_sequences_last_idx (last_job_id)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;
