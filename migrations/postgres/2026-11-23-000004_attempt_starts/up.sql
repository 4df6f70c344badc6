-- Attempt starts (DESIGN §6, invariant 8). `started_at` is when the current attempt's handler
-- started, as recorded by its node's next renewal (NULL from the claim until then); the
-- timeout deadline `timeout_at` is set from it, never from the claim. `refunds` counts the
-- attempts given back because the node holding the job lost it before any start was
-- recorded; it bounds those refunds, so a job that kills its node right at start still
-- reaches `dead`.
ALTER TABLE jobvisor_jobs ADD COLUMN started_at BIGINT NULL;
ALTER TABLE jobvisor_jobs ADD COLUMN refunds INTEGER NOT NULL DEFAULT 0;
ALTER TABLE jobvisor_jobs_archive ADD COLUMN started_at BIGINT NULL;
ALTER TABLE jobvisor_jobs_archive ADD COLUMN refunds INTEGER NOT NULL DEFAULT 0;
