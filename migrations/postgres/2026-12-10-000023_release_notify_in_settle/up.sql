-- A released dependency child is announced by the settle that releases it (`pg_notify` of
-- its queue in the same transaction, as a retry by hand is), not by a row trigger. An AFTER
-- UPDATE row trigger, even one whose WHEN clause is false, makes every update of a job's
-- state fetch the old row again for the trigger: one more buffer access per job in the
-- claim and again in the finalize, and 12–19 % more server time in those two statements
-- (measured: pg_stat_statements over a 20,000-job drain, with and without the trigger).
DROP TRIGGER jobvisor_jobs_notify_release ON jobvisor_jobs;
DROP FUNCTION jobvisor_notify_release();
