-- Throughput history: jobs that succeeded and that ended dead, per queue and 5-minute bucket,
-- written by the node that takes the database gauges' turn (every 15 s): it recounts the
-- current bucket, and in the first minute of a bucket the previous one, from the finish-time
-- indexes of the live table and the archive, and keeps 48 hours. The dashboard's history
-- reads these rows, never the jobs.
--   bucket     start of the 5 minutes, epoch µs (UTC), a multiple of 300,000,000
--   succeeded  jobs of the queue that succeeded in it
--   failed     jobs of the queue that ended dead in it
CREATE TABLE jobvisor_throughput (
    queue     TEXT   NOT NULL,
    bucket    BIGINT NOT NULL,
    succeeded BIGINT NOT NULL,
    failed    BIGINT NOT NULL,
    PRIMARY KEY (queue, bucket)
) WITHOUT ROWID;
CREATE INDEX jobvisor_throughput_bucket ON jobvisor_throughput (bucket);
