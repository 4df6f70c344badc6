ALTER TABLE jobvisor_jobs DROP COLUMN last_claimed_at;
ALTER TABLE jobvisor_jobs DROP COLUMN last_claim;
ALTER TABLE jobvisor_jobs DROP COLUMN last_node;
DROP TABLE jobvisor_claims;
