-- The sweeper's backstop (a parent whose settle a crash cut off) looks for open edges
-- (`done = false`) whose parent has ended. `jobvisor_job_deps_parent_idx (parent_id, done)`
-- cannot find them without reading every edge ever written; MariaDB has no partial index,
-- so this one leads with `done`: the backstop reads only the open edges' range. It is on
-- the edges table only: no enqueue, claim or finalize of a job without dependencies
-- maintains it.
CREATE INDEX jobvisor_job_deps_open_parent_idx ON jobvisor_job_deps (done, parent_id);
