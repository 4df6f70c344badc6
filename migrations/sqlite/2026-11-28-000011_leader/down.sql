DROP TABLE jobvisor_leader;
