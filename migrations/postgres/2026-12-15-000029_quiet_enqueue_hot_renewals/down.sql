CREATE INDEX jobvisor_jobs_running_sweep_idx ON jobvisor_jobs (queue, partition_key, lease_expires_at)
    WHERE state = 'running';
DROP INDEX jobvisor_jobs_running_idx;

CREATE OR REPLACE FUNCTION jobvisor_notify_insert() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('jobvisor_jobs', q.queue)
    FROM (SELECT DISTINCT queue FROM new_rows
          WHERE run_at <= (EXTRACT(EPOCH FROM now()) * 1000000)::bigint) AS q;
    RETURN NULL;
END;
$$;
