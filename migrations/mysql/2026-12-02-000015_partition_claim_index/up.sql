-- The partition index gains each job's place in claim order: `(queue, state, partition_key,
-- priority, run_at)` (and the primary key, as every InnoDB secondary index). The claim under
-- a per-partition limit, when the head of the queue is a backlog of full partitions, reads
-- the waiting jobs of each state in partition order and claim order within each partition,
-- 500 rows a statement, each starting after the last partition the one before reached, and
-- takes the first jobs of each partition with room: in index order, never sorted. Without
-- it that claim stepped over every job of the full partitions ahead on every claim. The
-- running-job counts use the same index's prefix. MySQL has no partial indexes, so this
-- index had, and has, an entry per job: it grows wider, not more numerous.
CREATE INDEX jobvisor_jobs_partition_idx
    ON jobvisor_jobs (queue, state, partition_key, priority, run_at);
DROP INDEX jobvisor_jobs_partition_running_idx ON jobvisor_jobs;
