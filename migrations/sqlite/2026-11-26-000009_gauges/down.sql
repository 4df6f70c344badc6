DROP TABLE jobvisor_gauges;
