-- Autovacuum of the live table after a fixed count of dead row versions, not a share of the
-- table. Every job leaves two (its claim and its end move it between partial indexes, so
-- neither is a heap-only update); succeeded jobs stay 24 h before the archiver moves them. With
-- the server's default (50 + 20 % of the live rows) the dead versions allowed before a vacuum
-- grew with the retained jobs: at 800 jobs/s, 288,000 after 30 minutes, 14 million after a
-- day. A fixed 10,000 keeps them to what one autovacuum round (autovacuum_naptime, 1 min by
-- default) lets pile up, whatever the table holds. A vacuum of a table mostly all-visible reads
-- only the pages changed since the last one, and skips the indexes when few pages hold dead
-- items (PostgreSQL 14+), so vacuuming often stays cheap.
ALTER TABLE jobvisor_jobs SET (autovacuum_vacuum_scale_factor = 0, autovacuum_vacuum_threshold = 10000);
