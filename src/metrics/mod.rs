//! Metrics, through the [`metrics`](https://docs.rs/metrics) facade: jobvisor records, the
//! embedding service chooses the exporter (with the `prometheus` feature,
//! `install_prometheus` sets one up; with `actix-web`, `actix_web_service` serves it).
//! With no recorder installed every call below is a no-op. Install the recorder before
//! starting the scheduler: the hot-path instruments are registered once, when a queue's
//! fetcher starts or a job kind is first seen, and one registered with no recorder stays a
//! no-op.
//!
//! # What is recorded
//! The names and labels are stable: dashboards and alerts may rely on them. Durations are in
//! seconds. `queue` and `kind` are the job's; `outcome` is one of `succeeded`, `retried`,
//! `dead`, `cancelled`, `snoozed` (the handler asked to run later) or `released` (given back
//! to run again at once: never started because its lease may be gone, or shutdown).
//!
//! Recorded by each node, for the jobs it runs:
//!
//! | name | type | labels | what |
//! |---|---|---|---|
//! | `jobvisor_jobs_claimed_total` | counter | queue | jobs claimed |
//! | `jobvisor_jobs_finished_total` | counter | queue, kind, outcome | finalizations written |
//! | `jobvisor_leases_lost_total` | counter | kind | results refused: the lease was gone |
//! | `jobvisor_jobs_fenced_total` | counter | kind | handlers stopped because the lease could not be renewed in time |
//! | `jobvisor_jobs_timed_out_total` | counter | kind | handlers stopped at their timeout |
//! | `jobvisor_jobs_reclaimed_total` | counter | kind, reason | jobs of any node reclaimed by this node's sweeper (`reason`: `lease_expired`, `timeout`) |
//! | `jobvisor_pickup_latency_seconds` | histogram | queue, kind | due (`run_at`) → handler started |
//! | `jobvisor_handler_duration_seconds` | histogram | queue, kind | handler start → return |
//! | `jobvisor_finalize_latency_seconds` | histogram | queue | handler return → its outcome confirmed written (the ack) |
//! | `jobvisor_end_to_end_seconds` | histogram | queue, kind | enqueued → written `succeeded`, `dead` or `cancelled` |
//! | `jobvisor_job_attempts` | histogram | queue, kind | attempts a job used, when it ends `succeeded` or `dead` |
//! | `jobvisor_claim_statement_seconds` | histogram | queue | one claim round trip |
//! | `jobvisor_finalize_statement_seconds` | histogram | | one finalization batch round trip |
//! | `jobvisor_renew_statement_seconds` | histogram | | one lease renewal round trip |
//! | `jobvisor_jobs_in_flight` | gauge | queue | jobs this node holds: running, prefetched, being written |
//! | `jobvisor_pool_connections` | gauge | state (`in_use`, `idle`) | the store's main pool |
//! | `jobvisor_pool_max_connections` | gauge | | its size |
//! | `jobvisor_pool_waited_total` | counter | | checkouts that had to wait for a connection |
//! | `jobvisor_pool_timed_out_total` | counter | | checkouts that gave up waiting |
//!
//! Recorded from the database, the same values on every node (see [`DatabaseGauges`]: the
//! counts run once per database per interval, whatever the number of nodes; aggregate them
//! with `max`, not `sum`):
//!
//! | name | type | labels | what |
//! |---|---|---|---|
//! | `jobvisor_jobs` | gauge | queue, state | live jobs (not yet archived) |
//! | `jobvisor_jobs_due` | gauge | queue, priority | waiting jobs whose `run_at` has passed: ready to run |
//! | `jobvisor_queue_lag_seconds` | gauge | queue | how long the oldest due job has waited (0: none waiting) |
//! | `jobvisor_node_heartbeat_age_seconds` | gauge | node | since each live node last reported (0 once it has left or is gone: silent for over 30 s, `NODE_GONE_AFTER`) |
//! | `jobvisor_nodes_gone` | gauge | | registered nodes silent for over 30 s: killed or cut off without a goodbye (`jobvisor nodes --forget` removes them) |
//! | `jobvisor_jobs_ended_recently` | gauge | queue, kind, state | jobs that reached `succeeded`, `dead` or `cancelled` in the last 5 minutes, read from the jobs table and its archive: throughput (÷ 300 s) and failures where only the database is seen (a standalone exporter) |
//! | `jobvisor_gauges_age_seconds` | gauge | | how old these database gauges are |
//! | `jobvisor_gauges_refresh_seconds` | gauge | | how long their last computation took |

use std::time::Duration;

use crate::job::JobState;

mod gauges;
mod handles;
#[cfg(feature = "prometheus")]
mod prometheus;
#[cfg(feature = "actix-web")]
mod service;

pub(crate) use gauges::Turn;
pub use gauges::{DatabaseGauges, DEFAULT_GAUGE_INTERVAL, MIN_GAUGE_INTERVAL};
pub(crate) use handles::{Finished, KindMetrics, OutcomeMetrics, QueueMetrics};
#[cfg(feature = "prometheus")]
#[cfg_attr(docsrs, doc(cfg(feature = "prometheus")))]
pub use prometheus::{install_prometheus, prometheus_builder, PrometheusHandle, DURATION_BUCKETS};
#[cfg(feature = "actix-web")]
#[cfg_attr(docsrs, doc(cfg(feature = "actix-web")))]
pub use service::actix_web_service;

/// Jobs claimed, by queue.
pub const JOBS_CLAIMED: &str = "jobvisor_jobs_claimed_total";
/// Finalizations written, by queue, kind and outcome.
pub const JOBS_FINISHED: &str = "jobvisor_jobs_finished_total";
/// Results refused because the lease was gone, by kind.
pub const LEASES_LOST: &str = "jobvisor_leases_lost_total";
/// Handlers stopped because their lease could not be renewed in time, by kind.
pub const JOBS_FENCED: &str = "jobvisor_jobs_fenced_total";
/// Handlers stopped at their timeout, by kind.
pub const JOBS_TIMED_OUT: &str = "jobvisor_jobs_timed_out_total";
/// Jobs reclaimed by this node's sweeper, by kind and reason.
pub const JOBS_RECLAIMED: &str = "jobvisor_jobs_reclaimed_total";
/// Due → started, by queue and kind.
pub const PICKUP_LATENCY: &str = "jobvisor_pickup_latency_seconds";
/// Handler run time, by queue and kind.
pub const HANDLER_DURATION: &str = "jobvisor_handler_duration_seconds";
/// Handler return → outcome written, by queue.
pub const FINALIZE_LATENCY: &str = "jobvisor_finalize_latency_seconds";
/// Enqueued → ended, by queue and kind.
pub const END_TO_END: &str = "jobvisor_end_to_end_seconds";
/// Attempts used by jobs that ended, by queue and kind.
pub const JOB_ATTEMPTS: &str = "jobvisor_job_attempts";
/// One claim statement, by queue.
pub const CLAIM_STATEMENT: &str = "jobvisor_claim_statement_seconds";
/// One finalization statement.
pub const FINALIZE_STATEMENT: &str = "jobvisor_finalize_statement_seconds";
/// One renewal statement.
pub const RENEW_STATEMENT: &str = "jobvisor_renew_statement_seconds";
/// Jobs held by this node, by queue.
pub const JOBS_IN_FLIGHT: &str = "jobvisor_jobs_in_flight";
/// The main pool's connections, by state (`in_use`, `idle`).
pub const POOL_CONNECTIONS: &str = "jobvisor_pool_connections";
/// The main pool's size.
pub const POOL_MAX_CONNECTIONS: &str = "jobvisor_pool_max_connections";
/// Pool checkouts that waited.
pub const POOL_WAITED: &str = "jobvisor_pool_waited_total";
/// Pool checkouts that timed out.
pub const POOL_TIMED_OUT: &str = "jobvisor_pool_timed_out_total";
/// Live jobs by queue and state (database-wide).
pub const JOBS: &str = "jobvisor_jobs";
/// Due waiting jobs by queue and priority (database-wide).
pub const JOBS_DUE: &str = "jobvisor_jobs_due";
/// Age of each queue's oldest due job (database-wide).
pub const QUEUE_LAG: &str = "jobvisor_queue_lag_seconds";
/// Time since each node's last heartbeat (database-wide).
pub const NODE_HEARTBEAT_AGE: &str = "jobvisor_node_heartbeat_age_seconds";
/// Registered nodes silent for longer than `NODE_GONE_AFTER` (database-wide).
pub const NODES_GONE: &str = "jobvisor_nodes_gone";
/// Jobs that ended in the last 5 minutes, by queue, kind and final state (database-wide).
pub const JOBS_ENDED: &str = "jobvisor_jobs_ended_recently";
/// Age of the database gauges.
pub const GAUGES_AGE: &str = "jobvisor_gauges_age_seconds";
/// How long the database gauges took to compute.
pub const GAUGES_REFRESH: &str = "jobvisor_gauges_refresh_seconds";

/// The kind of a metric, for its description.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Counter,
    Gauge,
    Histogram,
}

/// Every metric jobvisor records, with its `# HELP` text (the module docs' table says the
/// same: a unit test keeps the two in step).
const DESCRIPTIONS: &[(&str, Kind, &str)] = &[
    (JOBS_CLAIMED, Kind::Counter, "Jobs claimed by this node, by queue."),
    (JOBS_FINISHED, Kind::Counter, "Finalizations written by this node, by queue, kind and outcome (succeeded, retried, dead, cancelled, snoozed, released)."),
    (LEASES_LOST, Kind::Counter, "Results refused because the lease was gone, by kind."),
    (JOBS_FENCED, Kind::Counter, "Handlers stopped because their lease could not be renewed in time, by kind."),
    (JOBS_TIMED_OUT, Kind::Counter, "Handlers stopped at their timeout, by kind."),
    (JOBS_RECLAIMED, Kind::Counter, "Jobs of any node reclaimed by this node's sweeper, by kind and reason."),
    (PICKUP_LATENCY, Kind::Histogram, "Seconds from a job's due time to its handler's start, by queue and kind."),
    (HANDLER_DURATION, Kind::Histogram, "Seconds from a handler's start to its return, by queue and kind."),
    (FINALIZE_LATENCY, Kind::Histogram, "Seconds from a handler's return to its outcome confirmed written, by queue."),
    (END_TO_END, Kind::Histogram, "Seconds from enqueue to succeeded, dead or cancelled, by queue and kind."),
    (JOB_ATTEMPTS, Kind::Histogram, "Attempts a job used when it ended succeeded or dead, by queue and kind."),
    (CLAIM_STATEMENT, Kind::Histogram, "Seconds of one claim round trip, by queue."),
    (FINALIZE_STATEMENT, Kind::Histogram, "Seconds of one finalization batch round trip."),
    (RENEW_STATEMENT, Kind::Histogram, "Seconds of one lease renewal round trip."),
    (JOBS_IN_FLIGHT, Kind::Gauge, "Jobs this node holds (running, prefetched, being written), by queue."),
    (POOL_CONNECTIONS, Kind::Gauge, "Connections of the store's main pool, by state (in_use, idle)."),
    (POOL_MAX_CONNECTIONS, Kind::Gauge, "Size of the store's main pool."),
    (POOL_WAITED, Kind::Counter, "Pool checkouts that had to wait for a connection."),
    (POOL_TIMED_OUT, Kind::Counter, "Pool checkouts that gave up waiting."),
    (JOBS, Kind::Gauge, "Live (not archived) jobs by queue and state; database-wide, aggregate with max."),
    (JOBS_DUE, Kind::Gauge, "Waiting jobs whose run_at has passed, by queue and priority; database-wide, aggregate with max."),
    (QUEUE_LAG, Kind::Gauge, "Seconds the oldest due job of each queue has waited; database-wide, aggregate with max."),
    (NODE_HEARTBEAT_AGE, Kind::Gauge, "Seconds since each live node last reported; database-wide, aggregate with max."),
    (NODES_GONE, Kind::Gauge, "Registered nodes silent for over 30 s (killed or cut off); database-wide, aggregate with max."),
    (JOBS_ENDED, Kind::Gauge, "Jobs that reached succeeded, dead or cancelled in the last 5 minutes, by queue, kind and state; database-derived (read from the jobs table and its archive, not counted by a node), aggregate with max."),
    (GAUGES_AGE, Kind::Gauge, "Seconds since the database gauges were computed."),
    (GAUGES_REFRESH, Kind::Gauge, "Seconds the last computation of the database gauges took."),
];

/// Describes every metric to the installed recorder, so that an exporter writes each one's
/// `# HELP` line. `install_prometheus` (feature `prometheus`) does it; call it after
/// installing a recorder of your own (descriptions go to the recorder installed when this
/// runs).
pub fn describe() {
    for (name, kind, help) in DESCRIPTIONS {
        match kind {
            Kind::Counter => metrics::describe_counter!(*name, *help),
            Kind::Gauge => metrics::describe_gauge!(*name, *help),
            Kind::Histogram => metrics::describe_histogram!(*name, *help),
        }
    }
}

/// The `outcome` label of a written state (`released`: given back to run again at once).
pub(crate) fn outcome(state: JobState, released: bool) -> &'static str {
    match state {
        JobState::Succeeded => "succeeded",
        JobState::Retrying => "retried",
        JobState::Dead => "dead",
        JobState::Cancelled => "cancelled",
        JobState::Pending if released => "released",
        JobState::Pending | JobState::Running | JobState::Waiting => "snoozed",
    }
}

/// A finalization statement took `took`.
pub(crate) fn finalize_statement(took: Duration) {
    metrics::histogram!(FINALIZE_STATEMENT).record(took);
}

/// A renewal statement took `took`.
pub(crate) fn renew_statement(took: Duration) {
    metrics::histogram!(RENEW_STATEMENT).record(took);
}

/// Counts one event of a job of `kind` under `name` (lease lost, fenced, timed out).
pub(crate) fn count_kind(name: &'static str, kind: &str) {
    metrics::counter!(name, "kind" => kind.to_owned()).increment(1);
}

/// The sweeper reclaimed a job.
pub(crate) fn reclaimed(kind: &str, reason: &'static str) {
    metrics::counter!(JOBS_RECLAIMED, "kind" => kind.to_owned(), "reason" => reason).increment(1);
}

/// The store's pool, sampled.
pub(crate) fn pool(state: &bb8::State, max: u32) {
    let idle = state.idle_connections;
    let in_use = state.connections.saturating_sub(idle);
    metrics::gauge!(POOL_CONNECTIONS, "state" => "in_use").set(f64::from(in_use));
    metrics::gauge!(POOL_CONNECTIONS, "state" => "idle").set(f64::from(idle));
    metrics::gauge!(POOL_MAX_CONNECTIONS).set(f64::from(max));
    metrics::counter!(POOL_WAITED).absolute(state.statistics.get_waited);
    metrics::counter!(POOL_TIMED_OUT).absolute(state.statistics.get_timed_out);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_described_metric_is_in_the_docs_table_and_every_constant_is_described() {
        let docs = include_str!("mod.rs");
        for (name, _, help) in DESCRIPTIONS {
            assert!(
                docs.contains(&format!("| `{name}` |")),
                "{name} is not in the table"
            );
            assert!(!help.is_empty());
        }
        let constants = docs
            .lines()
            .filter(|l| l.starts_with("pub const ") && l.contains("\"jobvisor_"))
            .count();
        assert_eq!(
            DESCRIPTIONS.len(),
            constants,
            "a metric constant without a description"
        );
    }

    #[test]
    fn outcomes_name_every_written_state() {
        assert_eq!(outcome(JobState::Succeeded, false), "succeeded");
        assert_eq!(outcome(JobState::Retrying, false), "retried");
        assert_eq!(outcome(JobState::Dead, false), "dead");
        assert_eq!(outcome(JobState::Cancelled, false), "cancelled");
        assert_eq!(outcome(JobState::Pending, false), "snoozed");
        assert_eq!(outcome(JobState::Pending, true), "released");
    }
}
