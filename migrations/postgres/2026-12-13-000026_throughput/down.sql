DROP TABLE jobvisor_throughput;
