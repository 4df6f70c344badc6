DROP TABLE jobvisor_wakes;
