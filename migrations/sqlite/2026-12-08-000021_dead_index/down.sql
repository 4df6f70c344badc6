DROP INDEX jobvisor_jobs_dead_idx;
