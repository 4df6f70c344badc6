-- Periodic schedules: a row per schedule declared by some node's code (synced at start).
-- The leader fires the due ones: one transaction moves next_fire_at on (guarded by the value
-- it read, so of concurrent firers one wins) and inserts the fire's job, whose unique key is
-- the schedule and the fire's instant. Times are epoch µs (UTC).
--   spec          a cron expression (seconds optional), or "every <µs>" for a fixed interval
--   time_zone     the IANA zone the cron expression is read in
--   template      the job each fire enqueues (JSON: kind, queue, payload, priority,
--                 max_attempts, timeout_us)
--   missed        fires that passed while nobody fired: "latest", "all:<n>" or "skip"
--   paused_at     set while paused (no fire; the missed-fire policy applies on resume)
--   retired_at    set once no node declares it any more (kept for its history)
CREATE TABLE jobvisor_schedules (
    name         TEXT NOT NULL PRIMARY KEY,
    spec         VARCHAR(255) NOT NULL,
    time_zone    VARCHAR(64)  NOT NULL,
    template     TEXT NOT NULL,
    missed       VARCHAR(32)  NOT NULL,
    next_fire_at BIGINT       NOT NULL,
    last_fire_at BIGINT       NULL,
    paused_at    BIGINT       NULL,
    retired_at   BIGINT       NULL,
    updated_at   BIGINT       NOT NULL
);
