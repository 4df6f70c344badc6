DROP TABLE jobvisor_sequences;
