ALTER TABLE jobvisor_schedules DROP COLUMN origin;
