CREATE FUNCTION jobvisor_notify_release() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('jobvisor_jobs', NEW.queue);
    RETURN NULL;
END;
$$;

CREATE TRIGGER jobvisor_jobs_notify_release
    AFTER UPDATE OF state ON jobvisor_jobs
    FOR EACH ROW WHEN (OLD.state = 'waiting' AND NEW.state = 'pending')
    EXECUTE FUNCTION jobvisor_notify_release();
