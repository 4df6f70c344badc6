DROP TRIGGER jobvisor_jobs_notify_insert ON jobvisor_jobs;
DROP FUNCTION jobvisor_notify_insert();
