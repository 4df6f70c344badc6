CREATE INDEX jobvisor_jobs_partition_running_idx ON jobvisor_jobs (queue, state, partition_key);
DROP INDEX jobvisor_jobs_partition_idx ON jobvisor_jobs;
