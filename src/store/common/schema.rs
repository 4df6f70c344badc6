//! The `table!` definitions shared by all three backends.
//!
//! Only portable SQL types are used (`BigInt`, `Integer`, `Text`, `Json`), so one definition
//! type-checks every query on PostgreSQL, MySQL and SQLite; the migrations in
//! `migrations/<backend>` create matching tables. Times are `BigInt` microseconds since the
//! Unix epoch (UTC).

diesel::table! {
    /// Live jobs: everything not yet archived.
    jobvisor_jobs (id) {
        id -> BigInt,
        queue -> Text,
        kind -> Text,
        unique_key -> Nullable<Text>,
        state -> Text,
        priority -> Integer,
        payload -> Json,
        result -> Nullable<Json>,
        last_error -> Nullable<Json>,
        errors -> Json,
        attempts -> Integer,
        max_attempts -> Integer,
        run_at -> BigInt,
        timeout_ms -> BigInt,
        timeout_at -> Nullable<BigInt>,
        lease_owner -> Nullable<Text>,
        lease_token -> Nullable<Text>,
        lease_expires_at -> Nullable<BigInt>,
        heartbeat_at -> Nullable<BigInt>,
        version -> BigInt,
        cancel_requested_at -> Nullable<BigInt>,
        created_at -> BigInt,
        updated_at -> BigInt,
        first_started_at -> Nullable<BigInt>,
        finished_at -> Nullable<BigInt>,
        started_at -> Nullable<BigInt>,
        refunds -> Integer,
        partition_key -> Nullable<Text>,
        unique_hold -> Nullable<Text>,
        unique_until -> Nullable<BigInt>,
        unique_scope -> Nullable<Text>,
        progress -> Nullable<Json>,
    }
}

diesel::table! {
    /// Terminal jobs moved out of the live table by the archiver.
    jobvisor_jobs_archive (id) {
        id -> BigInt,
        queue -> Text,
        kind -> Text,
        unique_key -> Nullable<Text>,
        state -> Text,
        priority -> Integer,
        payload -> Json,
        result -> Nullable<Json>,
        last_error -> Nullable<Json>,
        errors -> Json,
        attempts -> Integer,
        max_attempts -> Integer,
        run_at -> BigInt,
        timeout_ms -> BigInt,
        timeout_at -> Nullable<BigInt>,
        lease_owner -> Nullable<Text>,
        lease_token -> Nullable<Text>,
        lease_expires_at -> Nullable<BigInt>,
        heartbeat_at -> Nullable<BigInt>,
        version -> BigInt,
        cancel_requested_at -> Nullable<BigInt>,
        created_at -> BigInt,
        updated_at -> BigInt,
        first_started_at -> Nullable<BigInt>,
        finished_at -> Nullable<BigInt>,
        archived_at -> BigInt,
        started_at -> Nullable<BigInt>,
        refunds -> Integer,
        partition_key -> Nullable<Text>,
        unique_until -> Nullable<BigInt>,
        unique_scope -> Nullable<Text>,
        progress -> Nullable<Json>,
    }
}

diesel::table! {
    /// The nodes running a scheduler and what they serve (JSON arrays of queue and kind
    /// names); see `store::nodes`.
    jobvisor_nodes (node) {
        node -> Text,
        queues -> Text,
        kinds -> Text,
        started_at -> BigInt,
        heartbeat_at -> BigInt,
    }
}

diesel::table! {
    /// Queue control shared by every node (see `store::queues`): a row per queue with a
    /// setting.
    jobvisor_queues (name) {
        name -> Text,
        paused_at -> Nullable<BigInt>,
        paused_by -> Nullable<Text>,
        concurrency_limit -> Nullable<Integer>,
        partition_limit -> Nullable<Integer>,
        rate_limit -> Nullable<Integer>,
        rate_period_us -> Nullable<BigInt>,
        claims -> BigInt,
        updated_at -> BigInt,
    }
}

diesel::table! {
    /// The claims of rate-limited queues: when, and how many jobs.
    jobvisor_queue_claims (id) {
        id -> BigInt,
        queue -> Text,
        claimed_at -> BigInt,
        jobs -> Integer,
    }
}

diesel::table! {
    /// The database-wide gauges, computed by one node per interval (see `store::gauges`).
    jobvisor_gauges (id) {
        id -> Integer,
        computed_at -> BigInt,
        computed_by -> Nullable<Text>,
        took_us -> BigInt,
        snapshot -> Text,
    }
}

diesel::table! {
    /// The leader of this database: one row, held under a lease with a term (see
    /// `store::leader`).
    jobvisor_leader (id) {
        id -> Integer,
        holder -> Nullable<Text>,
        term -> BigInt,
        expires_at -> BigInt,
        elected_at -> BigInt,
    }
}

diesel::table! {
    /// Periodic schedules, fired by the leader (see `store::schedules`).
    jobvisor_schedules (name) {
        name -> Text,
        spec -> Text,
        time_zone -> Text,
        template -> Text,
        missed -> Text,
        next_fire_at -> BigInt,
        last_fire_at -> Nullable<BigInt>,
        paused_at -> Nullable<BigInt>,
        retired_at -> Nullable<BigInt>,
        updated_at -> BigInt,
        declared_at -> BigInt,
        origin -> Text,
        shadowed_at -> Nullable<BigInt>,
    }
}

diesel::allow_tables_to_appear_in_same_query!(jobvisor_gauges, jobvisor_leader, jobvisor_schedules);

diesel::table! {
    /// The wake counter (see `store::wakes`): one row, moved by each transition that makes a
    /// job due now without a new id.
    jobvisor_wakes (id) {
        id -> Integer,
        n -> BigInt,
    }
}

diesel::allow_tables_to_appear_in_same_query!(
    jobvisor_jobs,
    jobvisor_nodes,
    jobvisor_queues,
    jobvisor_queue_claims,
    jobvisor_wakes
);

diesel::table! {
    /// Effects jobs recorded in their handlers' transactions (see `store::effects`): one row
    /// per (job, effect key).
    jobvisor_effects (job_id, effect_key) {
        job_id -> BigInt,
        effect_key -> Text,
        detail -> Nullable<Json>,
        claim -> Text,
        recorded_at -> BigInt,
    }
}

diesel::table! {
    /// The execution ledger (see `store::ledger`): one row per ended claim of a job.
    jobvisor_claims (job_id, claim_id) {
        job_id -> BigInt,
        claim_id -> Text,
        attempt -> Integer,
        node -> Text,
        claimed_at -> BigInt,
        started_at -> Nullable<BigInt>,
        ended_at -> BigInt,
        outcome -> Text,
        code -> Nullable<Text>,
        fence_margin_ms -> Nullable<BigInt>,
    }
}

diesel::allow_tables_to_appear_in_same_query!(jobvisor_jobs, jobvisor_claims);

diesel::table! {
    /// The live jobs' columns the execution ledger reads, with the claim a finalize last
    /// ended on the job (`last_*`, see `store::ledger`): `jobvisor_jobs` itself is at
    /// diesel's 32-column limit.
    #[sql_name = "jobvisor_jobs"]
    jobvisor_jobs_last (id) {
        id -> BigInt,
        state -> Text,
        attempts -> Integer,
        started_at -> Nullable<BigInt>,
        finished_at -> Nullable<BigInt>,
        updated_at -> BigInt,
        lease_owner -> Nullable<Text>,
        lease_token -> Nullable<Text>,
        last_node -> Nullable<Text>,
        last_claim -> Nullable<Text>,
        last_claimed_at -> Nullable<BigInt>,
    }
}

diesel::allow_tables_to_appear_in_same_query!(jobvisor_jobs_last, jobvisor_claims);

diesel::allow_tables_to_appear_in_same_query!(jobvisor_jobs, jobvisor_effects);

diesel::table! {
    /// Dependencies between jobs (see `store::dependencies`): one row per (child, parent).
    jobvisor_job_deps (child_id, parent_id) {
        child_id -> BigInt,
        parent_id -> BigInt,
        policy -> Text,
        done -> Bool,
    }
}

diesel::table! {
    /// The live jobs' columns the dependency code needs, with `has_children` (a job whose
    /// children must be settled when it ends): `jobvisor_jobs` itself is at diesel's
    /// 32-column limit.
    #[sql_name = "jobvisor_jobs"]
    jobvisor_jobs_links (id) {
        id -> BigInt,
        state -> Text,
        has_children -> Bool,
    }
}

diesel::allow_tables_to_appear_in_same_query!(jobvisor_jobs, jobvisor_job_deps);
diesel::allow_tables_to_appear_in_same_query!(jobvisor_jobs_archive, jobvisor_job_deps);

diesel::table! {
    /// The live jobs' columns start-by deadlines need (see `store::deadlines`), with
    /// `start_by`: `jobvisor_jobs` itself is at diesel's 32-column limit.
    #[sql_name = "jobvisor_jobs"]
    jobvisor_jobs_deadlines (id) {
        id -> BigInt,
        state -> Text,
        run_at -> BigInt,
        start_by -> Nullable<BigInt>,
    }
}

diesel::table! {
    /// Ordered sequences (see `store::sequences`): one row per sequence key with the last job
    /// enqueued in it and, after an enqueue's update, the one before it.
    jobvisor_sequences (sequence_key) {
        sequence_key -> Text,
        last_job_id -> BigInt,
        prev_job_id -> Nullable<BigInt>,
    }
}

diesel::table! {
    /// The audit log (see `store::audit`): one row per operator action.
    jobvisor_audit (id) {
        id -> BigInt,
        at -> BigInt,
        who -> Text,
        action -> Text,
        target -> Text,
        jobs -> BigInt,
        outcome -> Text,
        ok -> Bool,
    }
}

diesel::table! {
    /// Throughput history (see `store::throughput`): per queue and 5-minute bucket.
    jobvisor_throughput (queue, bucket) {
        queue -> Text,
        bucket -> BigInt,
        succeeded -> BigInt,
        failed -> BigInt,
    }
}
