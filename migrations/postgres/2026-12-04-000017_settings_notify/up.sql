-- Every change of a queue's settings (a pause, a resume, new limits; a row added or removed)
-- notifies `jobvisor_queues` with the queue's name, so every node serving it learns at once:
-- a pause stops its handler starts within a round trip, not at the next claim. A resume or
-- a loosened limit still wakes the fetchers on `jobvisor_jobs`, as before.
CREATE FUNCTION jobvisor_queues_settings_notify() RETURNS trigger AS $$
BEGIN
    IF TG_OP = 'DELETE' THEN
        PERFORM pg_notify('jobvisor_queues', OLD.name);
    ELSIF TG_OP = 'INSERT' OR (OLD.paused_at, OLD.concurrency_limit, OLD.partition_limit,
                               OLD.rate_limit, OLD.rate_period_us)
           IS DISTINCT FROM
           (NEW.paused_at, NEW.concurrency_limit, NEW.partition_limit, NEW.rate_limit,
            NEW.rate_period_us) THEN
        PERFORM pg_notify('jobvisor_queues', NEW.name);
    END IF;
    RETURN NULL;
END;
$$ LANGUAGE plpgsql;

CREATE TRIGGER jobvisor_queues_settings_notify_trg
    AFTER INSERT OR UPDATE OR DELETE ON jobvisor_queues
    FOR EACH ROW EXECUTE FUNCTION jobvisor_queues_settings_notify();
