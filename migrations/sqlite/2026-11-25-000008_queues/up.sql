-- Queue control shared by every node: a row per queue that has a setting. A queue without a
-- row runs as configured on each node (unlimited, not paused). Every setting is checked by
-- the claim itself (see ARCHITECTURE.md, "Queue control"):
--   paused_at / paused_by   a pause (epoch µs, and who asked); claims take nothing while set
--   concurrency_limit       most jobs of the queue running at once on all nodes (claimed
--                           jobs hold a lease whether started or prefetched: they count)
--   partition_limit         most running at once per partition key
--   rate_limit, rate_period_us
--                           most jobs claimed in any window of rate_period_us
--   claims                  bumped by every claim of a controlled queue: the row lock that
--                           serializes those claims, so each one counts what the previous
--                           committed
CREATE TABLE jobvisor_queues (
    name              TEXT    NOT NULL PRIMARY KEY,
    paused_at         BIGINT  NULL,
    paused_by         TEXT    NULL,
    concurrency_limit INTEGER NULL,
    partition_limit   INTEGER NULL,
    rate_limit        INTEGER NULL,
    rate_period_us    BIGINT  NULL,
    claims            BIGINT  NOT NULL DEFAULT 0,
    updated_at        BIGINT  NOT NULL
);

-- The claims of rate-limited queues: when each claim statement took how many jobs. A claim
-- sums the rows of its queue inside the window and takes at most what is left; rows older
-- than the window are deleted by the claims themselves.
CREATE TABLE jobvisor_queue_claims (
    id         INTEGER PRIMARY KEY,
    queue      TEXT    NOT NULL,
    claimed_at BIGINT  NOT NULL,
    jobs       INTEGER NOT NULL
);
CREATE INDEX jobvisor_queue_claims_queue_idx ON jobvisor_queue_claims (queue, claimed_at);
