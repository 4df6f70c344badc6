DROP TABLE jobvisor_effects;
