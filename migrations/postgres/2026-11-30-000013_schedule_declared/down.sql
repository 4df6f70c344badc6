ALTER TABLE jobvisor_schedules DROP COLUMN declared_at;
