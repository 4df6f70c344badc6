ALTER INDEX jobvisor_jobs_running_idx RESET (deduplicate_items);
