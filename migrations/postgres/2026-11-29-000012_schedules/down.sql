DROP TABLE jobvisor_schedules;
