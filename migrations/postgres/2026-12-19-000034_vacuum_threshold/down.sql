ALTER TABLE jobvisor_jobs RESET (autovacuum_vacuum_scale_factor, autovacuum_vacuum_threshold);
