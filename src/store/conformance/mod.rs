//! The conformance suite: every store transition and every invariant of ARCHITECTURE §6 that the
//! store alone can break, written once and run unchanged against PostgreSQL, MySQL/MariaDB and
//! SQLite (`conformance_tests!(Backend::…)` in `tests/store_<backend>.rs`).
//!
//! Each case gets a fresh, isolated database — a schema on PostgreSQL, a database on MySQL, a
//! temp file on SQLite — created from the URLs in `JOBVISOR_PG_URL` / `JOBVISOR_MYSQL_URL`
//! (default: the local services) and dropped afterwards. A server that cannot be reached fails
//! the case: a skipped backend is never a pass. All times are bound from a fixed test clock.
//!
//! One file per entity: `enqueue`, `claim`, `lease` (renewal, fencing), `finalize`,
//! `maintenance` (reclaim, archive, prune), `control` (cancel, manual retry), `reads` (get,
//! list, counts, the database clock), `bad_input` (bad input, bad URLs, corrupt rows,
//! concurrent migrations), `migrations` (jobvisor's migration records beside an application's), `partition` (partition keys), `unique` (unique-key scopes), `replace` (replace or skip on a duplicate key), `sequences` (ordered sequences per key), `deadlines` (start-by deadlines), `gauges` (the database-wide
//! gauges' turns and counts), `handler_tx` (a handler's own transaction: lease-fenced
//! completion, effect records), `ledger` (the execution ledger), `cut` (silent network cuts through [`proxy`]). A new store operation gets its
//! cases in the file of its entity, listed in [`conformance_tests!`](crate::conformance_tests).
//! Databases come from [`crate::testing::TestDb`].
//!
//! Not a stable API: it exists for jobvisor's own tests.

#![allow(missing_docs, clippy::unwrap_used, clippy::missing_panics_doc)]

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, TimeZone, Utc};
use diesel_async::{AsyncConnection, AsyncMysqlConnection, AsyncPgConnection};
use serde_json::json;

use super::*;

/// An application's SQLite connection, as diesel-async opens it (the outbox cases enqueue on
/// one).
type SqliteConn =
    diesel_async::sync_connection_wrapper::SyncConnectionWrapper<diesel::sqlite::SqliteConnection>;

mod bad_input;
mod claim;
mod control;
mod cut;
mod deadlines;
mod dependencies;
mod deploy;
mod done;
mod enqueue;
mod finalize;
mod gauges;
mod handler_tx;
mod leader;
mod lease;
mod ledger;
mod maintenance;
mod migrations;
mod partition;
mod partition_limits;
mod progress;
pub mod proxy;
mod queues;
mod rate;
mod reads;
mod replace;
mod schedules;
mod sequences;
mod unique;
mod wakes;

use super::driver::Listener;
use crate::error::Error;
use crate::job::{Job, JobFailure, JobId, JobState, NewJob, MAX_PARTITION_LEN};
use crate::lease::{LeaseToken, NodeId};
use crate::testing::{exec_sql, TestDb};
pub use bad_input::*;
pub use claim::*;
pub use control::*;
pub use cut::*;
pub use deadlines::*;
pub use dependencies::*;
pub use deploy::*;
pub use done::*;
pub use enqueue::*;
pub use finalize::*;
pub use gauges::*;
pub use handler_tx::*;
pub use leader::*;
pub use lease::*;
pub use ledger::*;
pub use maintenance::*;
pub use migrations::*;
pub use partition::*;
pub use partition_limits::*;
pub use progress::*;
pub use queues::*;
pub use rate::*;
pub use reads::*;
pub use replace::*;
pub use schedules::*;
pub use sequences::*;
pub use unique::*;
pub use wakes::*;

/// Everything a case needs.
#[derive(Debug)]
pub struct Bundle {
    pub db: TestDb,
    pub store: Store,
    pub t0: DateTime<Utc>,
}

impl Bundle {
    pub async fn new(backend: Backend) -> Bundle {
        let db = TestDb::create(backend).await;
        let store = db.store().await;
        Bundle {
            db,
            store,
            t0: Utc.with_ymd_and_hms(2030, 1, 1, 0, 0, 0).unwrap(),
        }
    }

    /// The test clock at t0 + `secs`.
    pub fn at(&self, secs: i64) -> Option<DateTime<Utc>> {
        Some(self.t0 + chrono::Duration::seconds(secs))
    }

    pub async fn enqueue(&self, job: NewJob, at: i64) -> JobId {
        let e = self.store.job_enqueue(job, self.at(at)).await.unwrap();
        assert!(!e.duplicate);
        e.id
    }

    pub async fn claim(&self, queue: &str, owner: &str, n: u32, at: i64) -> Vec<ClaimedJob> {
        self.store
            .job_claim(ClaimParams {
                queue: queue.into(),
                owner: NodeId::new(owner).unwrap(),
                limit: n,
                kinds: None,
                lease: Duration::from_secs(30),
                now: self.at(at),
            })
            .await
            .unwrap()
    }

    pub async fn finalize(&self, f: Finalize, at: i64) -> Guarded<JobState> {
        self.finalize_many(vec![f], at).await.pop().unwrap().1
    }

    /// Finalizes `items` in one batch at `at`; each job's outcome, in `items`' order.
    pub async fn finalize_many(
        &self,
        items: Vec<Finalize>,
        at: i64,
    ) -> Vec<(JobId, Guarded<JobState>)> {
        self.store
            .job_finalize_many(FinalizeParams {
                items,
                now: self.at(at),
            })
            .await
            .unwrap()
    }

    pub async fn renew(&self, id: JobId, token: &LeaseToken, at: i64) -> Guarded<Renewed> {
        self.renew_started(id, token, at, None).await
    }

    /// Renews, carrying a start `ago` seconds before `at` (grace 10 s).
    pub async fn renew_started(
        &self,
        id: JobId,
        token: &LeaseToken,
        at: i64,
        ago: Option<u64>,
    ) -> Guarded<Renewed> {
        let mut v = self
            .store
            .job_renew_leases(RenewParams {
                timeout_grace: Duration::from_secs(10),
                leases: vec![LeaseRef {
                    id,
                    token: token.clone(),
                    started_ago: ago.map(Duration::from_secs),
                    progress: None,
                }],
                lease: Duration::from_secs(30),
                now: self.at(at),
            })
            .await
            .unwrap();
        v.pop().unwrap().1
    }

    pub async fn reclaim(&self, at: i64) -> Vec<Reclaimed> {
        self.store
            .job_reclaim_expired(ReclaimParams {
                limit: 100,
                backoff: Arc::new(|attempt| Duration::from_secs(u64::from(attempt) * 10)),
                now: self.at(at),
            })
            .await
            .unwrap()
    }

    pub async fn get(&self, id: JobId) -> Job {
        self.store.job_get(id).await.unwrap().unwrap()
    }
}

/// The partition of a claimed job these cases enqueued with it in the payload (`"p"`): a
/// claim returns only what an attempt runs with, and the partition is not part of that.
fn partition_of(c: &ClaimedJob) -> Option<&str> {
    c.payload.get("p").and_then(serde_json::Value::as_str)
}

fn err(code: &str, attempt: u32) -> JobFailure {
    JobFailure::new(code, format!("{code} on attempt {attempt}"), attempt)
}

// ---------------------------------------------------------------------------------------
// Cases. Each takes the backend and builds its own isolated database.
// ---------------------------------------------------------------------------------------

/// Expands to one test per conformance case: `conformance_tests!(Backend::…)` runs each on a
/// multi-threaded runtime against that backend; `conformance_tests!(simulated)` runs each
/// against the fleet simulation's store (SQLite on tmpfs, its calls inline on a
/// current-thread runtime, a fault plan consulted before every guarded operation:
/// `testing::simulated_store`); `conformance_tests!(postgres_switched_off)` runs each against
/// PostgreSQL without `LISTEN`/`NOTIFY` and advisory locks (`testing::postgres_switches_off`).
#[macro_export]
macro_rules! conformance_tests {
    (simulated) => {
        $crate::conformance_tests!(@with simulated $crate::Backend::Sqlite);
    };
    (postgres_switched_off) => {
        $crate::conformance_tests!(@with switched $crate::Backend::Postgres);
    };
    ($backend:expr) => {
        $crate::conformance_tests!(@with threaded $backend);
    };
    (@with $mode:ident $backend:expr) => {
        $crate::conformance_tests!(@cases $mode $backend;
            enqueue_and_get_round_trip_every_field,
            enqueue_many_returns_ids_in_order_and_marks_duplicates,
            large_batches_keep_order_and_every_field,
            listeners_hear_due_inserts_of_every_kind,
            batches_of_large_payloads_are_split_and_kept,
            duplicate_unique_key_returns_the_existing_id,
            concurrent_enqueues_of_one_unique_key_create_one_row,
            claim_orders_by_priority_then_run_at_then_id,
            no_claim_before_run_at,
            claim_sets_lease_attempts_and_version,
            a_claim_returns_what_the_attempt_runs_with,
            concurrent_claimers_never_claim_a_job_twice,
            renew_extends_leases_and_reports_lost_ones,
            a_hedged_renewal_on_a_fresh_connection_renews_the_same_way,
            zombie_renew_and_finalize_are_rejected_after_reclaim_and_reclaim_by_another,
            finalize_succeeded_clears_last_error_and_keeps_attempts,
            attempts_exhausted_become_dead_with_every_error_kept,
            reclaim_moves_over_time_jobs_and_leaves_live_ones,
            an_unstarted_claim_is_never_over_time_and_gets_its_attempt_back,
            a_job_that_kills_its_node_at_start_still_ends_dead,
            renewals_record_each_start_once_and_stale_tokens_record_nothing,
            requeue_does_not_use_an_attempt,
            cancel_pending_running_and_finished_jobs,
            cancel_at_a_version_leaves_a_job_that_moved_on,
            manual_retry_of_a_dead_job_is_version_guarded,
            run_now_makes_a_later_job_due_version_guarded,
            delete_of_a_finished_job_is_version_guarded,
            ended_histogram_counts_finished_jobs_per_window,
            archive_moves_terminal_jobs_atomically_and_prune_deletes_them,
            archive_is_bounded_by_its_limit,
            finalize_many_mixes_outcomes_and_guards_each_row,
            a_batch_of_successes_writes_each_job_its_own_result_and_start,
            outbox_enqueue_follows_the_callers_transaction,
            bad_inputs_get_clear_errors_and_change_nothing,
            bad_urls_and_missing_schema_are_clear_errors,
            concurrent_migrations_are_safe,
            an_applications_diesel_migrations_fool_no_schema_check_and_are_left_alone,
            rows_in_diesels_table_move_once_under_concurrent_starts,
            list_pages_and_filters_and_counts,
            database_clock_is_used_when_no_time_is_bound,
            corrupt_rows_go_dead_and_the_batch_goes_on,
            a_silent_cut_bounds_every_hot_path_operation_and_the_heal_restores_them,
            a_renewal_never_waits_behind_a_hung_claim_or_finalization,
            a_connection_that_timed_out_is_closed_not_reused,
            server_side_bounds_are_set_on_every_connection,
            claims_take_only_the_kinds_their_node_runs,
            jobs_no_live_node_can_run_are_named_with_why,
            a_paused_queue_is_never_claimed_and_the_pause_is_shared_and_stored,
            a_concurrency_limit_is_never_exceeded_by_concurrent_claimers,
            a_rate_limit_bounds_claims_in_every_window,
            a_rate_limited_claim_records_when_it_took_the_queue_lock,
            partitions_at_their_limit_are_skipped_and_others_run,
            a_long_backlog_of_full_partitions_hides_no_others_due_jobs,
            a_walk_past_a_backlog_finds_every_partition_in_claim_order,
            a_retrying_job_behind_a_backlog_is_found,
            a_keyless_job_far_behind_a_backlog_runs,
            a_global_and_a_partition_limit_hold_together,
            a_dead_holders_slots_return_when_its_leases_expire,
            claims_follow_a_queue_whose_limits_change,
            a_resume_or_a_changed_limit_wakes_listeners,
            bad_queue_settings_get_clear_errors_and_change_nothing,
            partition_keys_round_trip_on_every_enqueue_path,
            bad_partition_keys_are_refused_and_nothing_stored,
            while_active_keys_are_held_until_the_job_finishes,
            until_archived_keys_are_held_until_the_job_is_archived,
            period_keys_are_held_for_their_period,
            concurrent_enqueues_of_one_key_hold_it_once_per_scope,
            concurrent_enqueues_after_a_period_take_it_over_once,
            bad_unique_scopes_are_refused,
            keyed_jobs_from_before_scopes_keep_their_key_after_the_migration,
            period_take_overs_follow_the_callers_transaction,
            concurrent_batches_after_a_period_take_it_over_once,
            a_duplicate_replaces_or_cancels_only_a_holder_that_has_not_started,
            a_repeat_within_a_batch_replaces_the_first,
            concurrent_replacing_enqueues_leave_one_pending_job_with_the_last_payload,
            bad_replacing_enqueues_are_refused,
            gauges_are_computed_once_per_interval_and_match_the_table,
            the_throughput_rollup_counts_each_ended_job_once_per_bucket,
            leadership_is_taken_by_one_renewed_taken_over_after_expiry_and_fenced_by_term,
            a_fire_is_recorded_with_exactly_one_job_under_concurrent_firers,
            a_schedule_is_retired_only_once_no_node_declares_it,
            runtime_schedules_are_added_changed_removed_and_never_retired_by_a_sync,
            a_runtime_schedule_fires_once_per_fire_and_never_after_removal,
            progress_is_written_with_the_renewal_and_guarded_by_the_token,
            a_zombies_business_write_rolls_back_with_its_completion,
            a_completion_the_body_rolls_back_leaves_the_job_running,
            sixteen_concurrent_attempts_of_one_effect_key_record_it_once,
            a_completed_attempt_is_never_written_again_and_a_fenced_one_never_commits,
            bad_effect_keys_and_transactions_get_clear_errors,
            a_child_starts_only_after_every_parent_succeeded,
            a_failed_parent_applies_each_childs_policy,
            a_missing_parent_is_a_clear_error_and_nothing_is_stored,
            the_batch_callback_is_released_once_when_the_last_members_race,
            a_parents_end_racing_its_childs_enqueue_never_strands_the_child,
            a_cascading_cancel_reaches_every_descendant,
            retrying_a_dead_parent_releases_its_waiting_children,
            the_archiver_keeps_a_parent_until_its_children_end,
            an_archived_parent_counts_with_its_final_state,
            an_enqueue_in_the_callers_transaction_names_parents,
            a_child_reads_its_parents_results_live_or_archived,
            a_wide_fan_in_is_read_by_pages_that_stop_past_the_cap,
            a_sequence_runs_in_enqueue_order_one_at_a_time_under_retries,
            a_failed_member_holds_the_sequence_by_its_policy,
            concurrent_enqueuers_of_one_sequence_form_one_chain_in_commit_order,
            a_tail_ending_while_the_next_member_is_enqueued_never_strands_it,
            batches_keep_their_order_and_keys_run_in_parallel,
            an_archived_tail_takes_its_sequence_row_with_it,
            a_members_sequence_key_is_read_back_live_and_archived,
            a_claim_returns_the_time_left_before_the_deadline,
            the_sweeper_ends_jobs_past_their_deadline_and_leaves_the_rest,
            deadlines_that_could_never_be_met_are_refused,
            a_jobs_deadline_is_read_back_live_and_archived,
            jobs_made_due_without_a_new_id_are_announced_and_nothing_else_is,
            no_trigger_fires_per_row_on_an_update_of_the_jobs,
            a_cancel_of_a_running_job_is_announced_to_its_holder,
            the_change_signal_counts_the_jobs_above_its_floor,
            a_job_given_back_reclaimed_elsewhere_and_finished_shows_each_claim,
            each_ending_is_recorded_with_its_outcome_and_code,
            a_late_answer_from_an_old_claim_never_edits_a_newer_claims_row,
            archive_and_prune_keep_a_jobs_ledger_with_it,
            a_jobs_end_is_announced_to_its_waits_alone,
            successes_alone_and_a_cancelled_holder_are_announced,
        );
    };
    (@cases threaded $backend:expr; $($case:ident),+ $(,)?) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn $case() {
                $crate::store::conformance::$case($backend).await;
            }
        )+
    };
    (@cases switched $backend:expr; $($case:ident),+ $(,)?) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn $case() {
                $crate::testing::postgres_switches_off();
                $crate::store::conformance::$case($backend).await;
            }
        )+
    };
    (@cases simulated $backend:expr; $($case:ident),+ $(,)?) => {
        $(
            #[test]
            fn $case() {
                $crate::testing::simulated_store(true);
                let rt = ::tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .expect("a current-thread runtime");
                rt.block_on($crate::store::conformance::$case($backend));
            }
        )+
    };
}
