-- The `waiting` state and `has_children` stay (rebuilding the table again would be the only
-- way to remove them); the dependency rows go.
DROP TABLE jobvisor_job_deps;
