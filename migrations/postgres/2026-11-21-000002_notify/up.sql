-- Wake listening nodes when due jobs are inserted: one notification per statement and queue
-- (PostgreSQL also folds identical notifications of one transaction, and delivers them at
-- commit). Payload: the queue name. Delayed jobs are left to the poll.
CREATE FUNCTION jobvisor_notify_insert() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('jobvisor_jobs', q.queue)
    FROM (SELECT DISTINCT queue FROM new_rows
          WHERE run_at <= (EXTRACT(EPOCH FROM now()) * 1000000)::bigint) AS q;
    RETURN NULL;
END;
$$;

CREATE TRIGGER jobvisor_jobs_notify_insert
    AFTER INSERT ON jobvisor_jobs
    REFERENCING NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION jobvisor_notify_insert();
