-- The dashboard's dead letters and its lists of dead or cancelled jobs. Partial on the two
-- states a job reaches only by failing or by an operator's cancel: a successful claim →
-- finalize never writes an entry here (enqueue, claim and a succeeded finalize are untouched;
-- see the drain budget), and the index stays as small as the failures are.
--   * dead letters: `state = 'dead' GROUP BY kind, code` is a walk (in group order, no sort) of the
--     `state = 'dead'` range, already in group order;
--   * a list filtered on a state that is rare (dead, cancelled), with or without a kind: a
--     range of this index instead of a walk of the whole primary key.
-- The code expression is the text `ErrorCode` renders (src/store/sqlite/sql.rs).
CREATE INDEX jobvisor_jobs_dead_idx
    ON jobvisor_jobs (state, kind, json_extract(last_error, '$.code'), id)
    WHERE state IN ('dead', 'cancelled');
