-- Effects a job recorded (JobTx::record_effect): one row per (job, effect key), written in
-- the handler's own transaction, so a retried attempt knows which effects already happened.
-- The primary key is what makes concurrent attempts record a key once. Rows stay while their
-- job is live or archived and are deleted with it when the archive is pruned.
--   effect_key   chosen by the handler, 1 to 255 bytes
--   detail       JSON the handler recorded with it (a provider's charge id), or NULL
--   claim        the claim id (16 hex digits) of the attempt that recorded it
--   recorded_at  epoch µs (UTC), the database's clock
CREATE TABLE jobvisor_effects (
    job_id      BIGINT       NOT NULL,
    effect_key  VARCHAR(255) NOT NULL,
    detail      JSON         NULL,
    claim       VARCHAR(16)  NOT NULL,
    recorded_at BIGINT       NOT NULL,
    PRIMARY KEY (job_id, effect_key)
);
