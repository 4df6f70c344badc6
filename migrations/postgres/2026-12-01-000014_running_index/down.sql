CREATE INDEX jobvisor_jobs_partition_running_idx ON jobvisor_jobs (queue, partition_key)
    WHERE state = 'running' AND partition_key IS NOT NULL;
DROP INDEX jobvisor_jobs_running_idx;
