DROP TABLE jobvisor_jobs_archive;
DROP TABLE jobvisor_jobs;
