//! The hot path's instruments, registered once and then only updated: a registration hashes
//! the name and labels and looks them up in the recorder; an update is an atomic operation.
//! The fetcher holds its queue's [`QueueMetrics`] and a [`KindMetrics`] per kind (with its
//! [`OutcomeMetrics`]), shared with each job's supervisor and lease.

use std::time::Duration;

use chrono::{DateTime, Utc};
use metrics::{Counter, Gauge, Histogram};

use crate::job::JobState;

/// One queue's claim instruments.
#[derive(Debug)]
pub(crate) struct QueueMetrics {
    claimed: Counter,
    claim_statement: Histogram,
    in_flight: Gauge,
}

impl QueueMetrics {
    pub(crate) fn new(queue: &str) -> Self {
        QueueMetrics {
            claimed: metrics::counter!(super::JOBS_CLAIMED, "queue" => queue.to_owned()),
            claim_statement: metrics::histogram!(
                super::CLAIM_STATEMENT, "queue" => queue.to_owned()
            ),
            in_flight: metrics::gauge!(super::JOBS_IN_FLIGHT, "queue" => queue.to_owned()),
        }
    }

    /// A claim came back with `n` jobs after `took`.
    pub(crate) fn claimed(&self, n: usize, took: Duration) {
        self.claim_statement.record(took);
        if n > 0 {
            self.claimed.increment(n as u64);
        }
    }

    /// This node holds `n` jobs of the queue.
    pub(crate) fn in_flight(&self, n: u32) {
        self.in_flight.set(f64::from(n));
    }
}

/// One (queue, kind)'s handler and outcome instruments: the fetcher registers them once per
/// kind and every job's supervisor and lease carry them, so no job looks them up.
#[derive(Debug)]
pub(crate) struct KindMetrics {
    pickup: Histogram,
    handler: Histogram,
    outcome: OutcomeMetrics,
}

impl KindMetrics {
    pub(crate) fn new(queue: &str, kind: &str) -> Self {
        let labels = [("queue", queue.to_owned()), ("kind", kind.to_owned())];
        KindMetrics {
            pickup: metrics::histogram!(super::PICKUP_LATENCY, &labels),
            handler: metrics::histogram!(super::HANDLER_DURATION, &labels),
            outcome: OutcomeMetrics::new(queue, kind),
        }
    }

    /// The outcome instruments of the same queue and kind.
    pub(crate) fn outcome(&self) -> &OutcomeMetrics {
        &self.outcome
    }

    /// A handler started, `pickup` after its job became due.
    pub(crate) fn started(&self, pickup: Duration) {
        self.pickup.record(pickup);
    }

    /// A handler returned after `took`.
    pub(crate) fn handler_ran(&self, took: Duration) {
        self.handler.record(took);
    }
}

/// The `outcome` labels, in [`OutcomeMetrics::finished`]'s order.
const OUTCOMES: [&str; 6] = [
    "succeeded",
    "retried",
    "dead",
    "cancelled",
    "snoozed",
    "released",
];

/// One (queue, kind)'s outcome instruments.
#[derive(Debug)]
pub(crate) struct OutcomeMetrics {
    /// Per outcome, in [`OUTCOMES`]' order.
    finished: [Counter; 6],
    finalize_latency: Histogram,
    end_to_end: Histogram,
    attempts: Histogram,
}

/// What a confirmed finalization wrote, for [`OutcomeMetrics::record`].
#[derive(Debug, Clone, Copy)]
pub(crate) struct Finished {
    pub(crate) state: JobState,
    pub(crate) attempt: u32,
    /// Given back to run again at once (never started, shutdown), not a handler's outcome.
    pub(crate) released: bool,
    /// When the job was enqueued.
    pub(crate) created_at: Option<DateTime<Utc>>,
    /// Since the handler returned.
    pub(crate) waited: Duration,
}

impl OutcomeMetrics {
    pub(crate) fn new(queue: &str, kind: &str) -> Self {
        let labels = [("queue", queue.to_owned()), ("kind", kind.to_owned())];
        OutcomeMetrics {
            finished: OUTCOMES.map(|o| {
                metrics::counter!(super::JOBS_FINISHED, "queue" => queue.to_owned(),
                    "kind" => kind.to_owned(), "outcome" => o)
            }),
            finalize_latency: metrics::histogram!(
                super::FINALIZE_LATENCY, "queue" => queue.to_owned()
            ),
            end_to_end: metrics::histogram!(super::END_TO_END, &labels),
            attempts: metrics::histogram!(super::JOB_ATTEMPTS, &labels),
        }
    }

    /// One finalization was confirmed written at `now`.
    pub(crate) fn record(&self, f: &Finished, now: DateTime<Utc>) {
        let label = super::outcome(f.state, f.released);
        if let Some(i) = OUTCOMES.iter().position(|o| *o == label) {
            self.finished[i].increment(1);
        }
        if f.released {
            return;
        }
        self.finalize_latency.record(f.waited);
        if matches!(
            f.state,
            JobState::Succeeded | JobState::Dead | JobState::Cancelled
        ) {
            if let Some(created) = f.created_at {
                self.end_to_end
                    .record((now - created).to_std().unwrap_or(Duration::ZERO));
            }
        }
        if matches!(f.state, JobState::Succeeded | JobState::Dead) {
            self.attempts.record(f64::from(f.attempt));
        }
    }
}
