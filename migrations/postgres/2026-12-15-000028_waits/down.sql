DROP FUNCTION jobvisor_announce_done(BIGINT[]);
DROP TABLE jobvisor_waits;
