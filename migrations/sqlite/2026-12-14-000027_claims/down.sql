DROP TABLE jobvisor_claims;
