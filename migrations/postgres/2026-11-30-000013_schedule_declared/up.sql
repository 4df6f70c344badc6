-- When a node last declared each schedule (epoch µs). Every node that declares a schedule
-- refreshes this while it runs; a schedule is retired only once no node has declared it for
-- a while, so a node of an older release restarting mid-deploy cannot retire a schedule the
-- newer nodes still declare.
ALTER TABLE jobvisor_schedules ADD COLUMN declared_at BIGINT NOT NULL DEFAULT 0;
UPDATE jobvisor_schedules SET declared_at = updated_at;
