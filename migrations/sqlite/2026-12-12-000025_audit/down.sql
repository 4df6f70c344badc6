DROP TABLE jobvisor_audit;
